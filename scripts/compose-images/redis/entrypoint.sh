#!/bin/sh
# redis-server as user redis, protected mode off (the official image builds it so), listening on all interfaces
set -e
if [ "$1" = redis-server ]; then
  shift
  set -- redis-server --protected-mode no --bind "* -::*" "$@"
  chown -R redis:redis /data
  exec setpriv --reuid=redis --regid=redis --init-groups "$@"
fi
exec "$@"
