#!/usr/bin/env bash
# The gateway: nginx on one origin in front of the services, rendered from deploy/routes.tsv (the
# route table the Kubernetes Ingress is checked against) and run in the foreground.
#
#   scripts/gateway.sh --dir DIR --listen 127.0.0.1:8080 \
#       --runs 127.0.0.1:8082[,127.0.0.1:9082] --history ... --attachments ... [--web DIR]
#
# Every replica of a service is an upstream server; a refused connection moves on to the next
# (no request is sent twice once it reached a replica). Streaming routes are unbuffered with
# hour-long reads, the WebSocket is upgraded, uploads take 100 MB files. `/` serves the web
# client's built files (web/dist) when --web is given.
source "$(dirname "$0")/lib/common.sh"

dir="" listen="" web=""
declare -A upstreams=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --listen) listen="$2"; shift 2 ;;
    --web) web="$2"; shift 2 ;;
    --runs | --history | --attachments) upstreams[${1#--}]="$2"; shift 2 ;;
    --render-only) render_only=1; shift ;;
    *) die "gateway.sh: unknown argument $1" ;;
  esac
done
[ -n "$dir" ] && [ -n "$listen" ] || die "gateway.sh: --dir and --listen are required"
for service in runs history attachments; do
  [ -n "${upstreams[$service]:-}" ] || die "gateway.sh: --$service HOST:PORT[,HOST:PORT] is required"
done
command -v nginx >/dev/null || die "nginx is not installed (scripts/infra.sh installs it)"

mkdir -p "$dir/temp"
# Workers run as nobody when the master is root: their temporary files must be theirs to write.
[ "$(id -u)" = 0 ] && chmod 777 "$dir/temp"
conf="$dir/nginx.conf"

render() {
  cat <<CONF
# Rendered by scripts/gateway.sh from deploy/routes.tsv; do not edit.
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/temp/body;
  proxy_temp_path $dir/temp/proxy;
  fastcgi_temp_path $dir/temp/fastcgi;
  uwsgi_temp_path $dir/temp/uwsgi;
  scgi_temp_path $dir/temp/scgi;
  include /etc/nginx/mime.types;
  default_type application/octet-stream;
  server_tokens off;

  map \$http_upgrade \$connection_upgrade { default upgrade; '' ''; }

CONF
  local service server
  for service in runs history attachments; do
    echo "  upstream $service {"
    for server in ${upstreams[$service]//,/ }; do
      echo "    server $server max_fails=1 fail_timeout=2s;"
    done
    echo "    keepalive 64;"
    echo "  }"
  done
  cat <<CONF

  server {
    listen $listen;
    # 100 MB files plus the form around them.
    client_max_body_size 101m;
    proxy_http_version 1.1;
    proxy_set_header Host \$http_host;
    proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    proxy_set_header X-Forwarded-Proto \$scheme;
    proxy_set_header Connection "";
    # A replica that refuses the connection or is gone: the next one. Never a request twice.
    proxy_next_upstream error timeout;
    proxy_connect_timeout 2s;
CONF
  local match path kind
  while read -r match path service kind; do
    case "$match" in '' | \#*) continue ;; esac
    local locations=()
    case "$match" in
      exact) locations=("= $path") ;;
      # A prefix ending in "/" is only what is under it (its parent path may go elsewhere).
      prefix) case "$path" in */) locations=("^~ $path") ;; *) locations=("= $path" "^~ $path/") ;; esac ;;
      *) die "deploy/routes.tsv: unknown match $match" ;;
    esac
    local location
    for location in "${locations[@]}"; do
      echo "    location $location {"
      echo "      proxy_pass http://$service;"
      case "$kind" in
        stream)
          echo "      proxy_buffering off;"
          echo "      proxy_cache off;"
          echo "      proxy_read_timeout 3600s;"
          echo "      proxy_send_timeout 3600s;"
          ;;
        websocket)
          echo "      proxy_set_header Host \$http_host;"
          echo "      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;"
          echo "      proxy_set_header X-Forwarded-Proto \$scheme;"
          echo "      proxy_set_header Upgrade \$http_upgrade;"
          echo "      proxy_set_header Connection \$connection_upgrade;"
          echo "      proxy_read_timeout 3600s;"
          echo "      proxy_send_timeout 3600s;"
          ;;
        upload)
          echo "      proxy_request_buffering off;"
          echo "      proxy_buffering off;"
          echo "      proxy_read_timeout 300s;"
          echo "      proxy_send_timeout 300s;"
          ;;
        plain) ;;
        *) die "deploy/routes.tsv: unknown kind $kind" ;;
      esac
      echo "    }"
    done
  done <"$ROOT/deploy/routes.tsv"
  if [ -n "$web" ]; then
    cat <<CONF
    location / {
      root $web;
      try_files \$uri /index.html =404;
      add_header X-Content-Type-Options nosniff always;
      add_header Referrer-Policy no-referrer always;
    }
CONF
  else
    echo "    location / { return 404; }"
  fi
  echo "  }"
  echo "}"
}

render >"$conf"
nginx -t -q -p "$dir" -c "$conf"
[ -n "${render_only:-}" ] && exit 0
exec nginx -p "$dir" -c "$conf" -g 'daemon off;'
