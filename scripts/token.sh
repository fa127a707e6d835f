#!/usr/bin/env bash
# Prints an HS256 bearer token for the local platform: scripts/token.sh SUB [TTL_SECONDS]
source "$(dirname "$0")/lib/common.sh"
sub="${1:?usage: scripts/token.sh SUB [TTL_SECONDS]}"
ttl="${2:-3600}"
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
now=$(date +%s)
header=$(printf '{"alg":"HS256","typ":"JWT"}' | b64url)
payload=$(SUB="$sub" python3 -c 'import json,os,sys; print(json.dumps({"sub":os.environ["SUB"],"iat":int(sys.argv[1]),"exp":int(sys.argv[1])+int(sys.argv[2])},separators=(",",":")),end="")' "$now" "$ttl" | b64url)
signature=$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -hmac "$JWT_SECRET" -binary | b64url)
printf '%s.%s.%s\n' "$header" "$payload" "$signature"
