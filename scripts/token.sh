#!/usr/bin/env bash
# Prints an HS256 bearer token for the local platform: scripts/token.sh SUB [TTL_SECONDS]
source "$(dirname "$0")/lib/common.sh"
dev_token "${1:?usage: scripts/token.sh SUB [TTL_SECONDS]}" "${2:-3600}"
