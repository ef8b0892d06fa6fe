#!/usr/bin/env bash
# Single-node Kafka (KRaft) for integration tests; see tests/kafka/kafka_server.py.
#   scripts/kafka.sh build            build/cache the broker classpath (Maven)
#   scripts/kafka.sh start DIR        start detached in DIR, print bootstrap
#   scripts/kafka.sh stop DIR         stop the broker of DIR
#   scripts/kafka.sh run DIR          start in the foreground until Ctrl-C
#   scripts/kafka.sh status DIR       print bootstrap and state
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "$root/.venv/bin/python" ]]; then py="$root/.venv/bin/python"; else py="python3"; fi
module="$root/tests/kafka/kafka_cli.py"
usage() { echo "usage: $0 build | start DIR | stop DIR | run DIR | status DIR" >&2; exit 2; }
cmd="${1:-}"
case "$cmd" in
  build) shift; exec "$py" "$module" build "$@" ;;
  start|stop|run|status)
    [[ $# -ge 2 ]] || usage
    dir="$2"; shift 2
    exec "$py" "$module" "$cmd" --dir "$dir" "$@" ;;
  *) usage ;;
esac
