#!/usr/bin/env bash
# A two-node Ray cluster on loopback addresses (Linux), for trying `ray job submit` on one
# machine: a head node on 127.0.0.2 and a worker node on 127.0.0.3, each a `ray start --block`
# process in its own session, with its own temp dir, as if on two machines. The dashboard and
# job server bind to 127.0.0.1. Stops only what it started.
#
#   bash cluster/start-local-cluster.sh start
#   RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 --working-dir . \
#       --runtime-env cluster/runtime_env.yaml -- python -m peer_rl.cli train trainer.total_steps=1
#   bash cluster/start-local-cluster.sh stop
#
# Why not 127.0.0.1 for the nodes: `ray start` rewrites 127.0.0.1 / localhost (in --address
# and --node-ip-address) to the machine's interface address, unless
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and with that setting a non-head `ray start` refuses to
# run ("Multi-node Ray clusters are not supported on Windows and OSX"). Other 127/8 addresses
# are kept as given. Note that Ray's GCS,
# raylet and worker gRPC ports then listen on all interfaces; token authentication
# (RAY_AUTH_MODE=token, ~/.ray/auth_token, created if missing) guards them.
#
# Settings (environment): PEER_RL_CLUSTER_DIR (logs, pid files and the nodes' Ray temp dirs;
# default /tmp/peer-rl-cluster, keep it short: Ray's socket paths must stay under 108 bytes),
# RAY_PORT (GCS, 6380), DASHBOARD_PORT (8265), HEAD_CPUS / WORKER_CPUS (1 each: the tiny recipe's
# 1.5 CPUs then span both nodes), HEAD_GPUS / WORKER_GPUS (0 each; GPUs a node declares to Ray
# without having them, for `peer-rl plan --from-ray ... --probe`), OBJECT_STORE_BYTES (per node; default: Ray's, 30% of memory),
# RAY_AUTH_TOKEN_PATH (the token file; default ~/.ray/auth_token).
# Never `ray stop` here: it stops every Ray cluster of this user on the machine.
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ -x .venv/bin/ray ]]; then
  export PATH="$(pwd)/.venv/bin:$PATH"   # the job driver's `python` is the venv's
fi
DIR="${PEER_RL_CLUSTER_DIR:-/tmp/peer-rl-cluster}"
RAY_PORT="${RAY_PORT:-6380}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
HEAD_CPUS="${HEAD_CPUS:-1}"
WORKER_CPUS="${WORKER_CPUS:-1}"
HEAD_GPUS="${HEAD_GPUS:-0}"
WORKER_GPUS="${WORKER_GPUS:-0}"
OBJECT_STORE=()
if [[ -n "${OBJECT_STORE_BYTES:-}" ]]; then OBJECT_STORE=(--object-store-memory="$OBJECT_STORE_BYTES"); fi
HEAD_IP=127.0.0.2
WORKER_IP=127.0.0.3
export RAY_AUTH_MODE=token
unset RAY_ADDRESS RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER

# N distinct free ports: all N sockets are held open until every port is chosen (ports picked
# one at a time can repeat, and Ray refuses two components on one port)
free_ports() {
  python -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# two nodes on one host must not share the agents' default ports; the head also takes its Ray
# client server's port from the same draw ("head")
node_ports() {
  local p
  read -r -a p <<< "$(free_ports 5)"
  echo "--dashboard-agent-listen-port=${p[0]} --dashboard-agent-grpc-port=${p[1]}" \
       "--runtime-env-agent-port=${p[2]} --metrics-export-port=${p[3]}" \
       "--min-worker-port=0 --max-worker-port=0"
  if [ "${1:-}" = head ]; then echo "--ray-client-server-port=${p[4]}"; fi
}

alive() { [[ -f "$DIR/$1.pid" ]] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

start_node() {  # name, node ip, ray start args...: `ray start --block` in its own session
  local name=$1 ip=$2; shift 2
  mkdir -p "$DIR/$name"
  setsid ray start --block --node-ip-address="$ip" --temp-dir="$DIR/$name" \
    --disable-usage-stats ${OBJECT_STORE[@]+"${OBJECT_STORE[@]}"} "$@" >"$DIR/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/$name.pid"
}

wait_nodes() {  # n: until n nodes are alive
  local n
  for _ in $(seq 120); do
    for name in head worker; do
      if [[ -f "$DIR/$name.pid" ]] && ! alive "$name"; then
        echo "error: the $name node exited; see $DIR/$name.log" >&2
        tail -20 "$DIR/$name.log" >&2
        exit 1
      fi
    done
    n=$(ray list nodes --address "http://127.0.0.1:$DASHBOARD_PORT" --filter state=ALIVE \
          --format json 2>/dev/null \
        | python -c 'import json, sys; print(len(json.load(sys.stdin)))' 2>/dev/null || echo 0)
    [[ "$n" -ge "$1" ]] && return 0
    sleep 1
  done
  echo "error: fewer than $1 node(s) alive after 120 s; logs in $DIR" >&2
  exit 1
}

session_pids() { ps -e -o pid=,sid= | awk -v s="$1" '$2 == s {print $1}'; }
# the node's workers (actors and idle workers, not its agents): at a stop nothing of theirs is
# kept, and a detached actor left by a finished run (Ray Train's _AutoscalingCoordinatorActor)
# otherwise holds its node's stop for ~30 s
worker_pids() {
  ps -e -o pid=,sid=,args= | awk -v s="$1" '$2 == s && $3 ~ /^ray::/ && $3 !~ /Agent$/ {print $1}'
}

stop() {
  local name sid
  # SIGTERM to each `ray start --block` (worker first): it stops its raylet, GCS, agents and
  # workers in order, in seconds (signalling the whole group at once unwinds far slower)
  for name in worker head; do
    if alive "$name"; then kill -TERM "$(cat "$DIR/$name.pid")" 2>/dev/null || true; fi
  done
  for name in worker head; do
    [[ -f "$DIR/$name.pid" ]] || continue
    for pid in $(worker_pids "$(cat "$DIR/$name.pid")"); do kill -KILL "$pid" 2>/dev/null || true; done
  done
  for name in worker head; do
    [[ -f "$DIR/$name.pid" ]] || continue
    sid=$(cat "$DIR/$name.pid")
    for _ in $(seq 30); do [[ -z "$(session_pids "$sid")" ]] && break; sleep 1; done
    for pid in $(session_pids "$sid"); do  # whatever is left of that session, by pid
      kill -KILL "$pid" 2>/dev/null || true
    done
    rm -f "$DIR/$name.pid"
  done
  echo "stopped the local cluster in $DIR"
}

case "${1:-start}" in
  start)
    if alive head || alive worker; then
      echo "already running (state in $DIR); run '$0 stop' first" >&2
      exit 1
    fi
    mkdir -p "$DIR"
    ray get-auth-token --generate >/dev/null
    # shellcheck disable=SC2046
    start_node head "$HEAD_IP" --head --port="$RAY_PORT" --dashboard-host=127.0.0.1 \
      --dashboard-port="$DASHBOARD_PORT" \
      --num-cpus="$HEAD_CPUS" --num-gpus="$HEAD_GPUS" $(node_ports head)
    wait_nodes 1
    # shellcheck disable=SC2046
    start_node worker "$WORKER_IP" --address="$HEAD_IP:$RAY_PORT" \
      --num-cpus="$WORKER_CPUS" --num-gpus="$WORKER_GPUS" --resources='{"node2": 1}' $(node_ports)
    wait_nodes 2
    echo "2 nodes ($HEAD_IP, $WORKER_IP); dashboard / job server: http://127.0.0.1:$DASHBOARD_PORT"
    echo "logs: $DIR/{head,worker}.log and $DIR/{head,worker}/session_latest/logs"
    ;;
  stop) stop ;;
  status)
    for name in head worker; do
      if alive "$name"; then echo "$name: running (pid $(cat "$DIR/$name.pid"))"
      else echo "$name: stopped"; fi
    done
    ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
