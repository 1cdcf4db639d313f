#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
#
# netns.sh - models H hosts on this one Linux machine so that loom's TCP path
# can be measured on links of a chosen speed: one network namespace per host
# (loom-h<h>, interface vh<h>, address 10.77.0.<h+1>/24) plugged into a bridge
# in a switch namespace (loom-sw), each link shaped with tc in both directions.
# It launches loom ranks into those namespaces with the LOOM_* variables that
# loomCommInitFromEnv reads. It creates nothing in the caller's namespace and
# deletes only namespaces named loom-sw and loom-h<N>. Needs root, ip and tc.
# bench/hosts/run drives it; it also works by hand:
#   netns.sh up 2 1gbit; netns.sh exec 2 1 build/bench/all_reduce_perf -b 1M; netns.sh down
set -u

NS_PREFIX=loom-h
NS_SWITCH=loom-sw
SUBNET=10.77.0
BRIDGE=br0

usage() {
    cat <<'EOF'
usage: netns.sh up H RATE      create H host namespaces on one switch; RATE is a tc rate
                               (1gbit, 10gbit, 500mbit) for both directions of every
                               host link, or none (unshaped)
       netns.sh down           delete them (and end what still runs inside); idempotent
       netns.sh exec [--out DIR] [--timeout SEC] [--bind core|none] H L PROG [ARGS...]
                               start H*L ranks of PROG, rank h*L+l in loom-h<h>, wait
                               for all, print rank 0's stdout; non-zero if any failed
       netns.sh status         list the namespaces, addresses and qdiscs
exec writes rank<r>.out and rank<r>.err in DIR (default: a new temporary directory)
and prints every rank's stderr when a rank fails. The first failing rank takes the
others down (SIGTERM, SIGKILL 2 s later) and lends exec its exit status; after
SEC seconds (default 600) all ranks are killed and exec exits 124. Rank r is pinned
to the (r mod C)-th CPU this shell may use (--bind core, the default), as loomrun
does. LOOM_* variables already in the environment reach the ranks, except those
exec sets: LOOM_RANK, LOOM_WORLD_SIZE, LOOM_LOCAL_RANK, LOOM_LOCAL_SIZE,
LOOM_COMM_ID, LOOM_SECRET, LOOM_HOST_ID, LOOM_SOCKET_IFNAME.
EOF
}

die() {
    echo "netns.sh: $*" >&2
    exit 2
}

need_root() {
    [ "$(id -u)" = 0 ] || die "network namespaces need root (run as root or with sudo)"
    command -v ip >/dev/null || die "ip not found (apt-get install iproute2)"
}

is_count() { [[ "$1" =~ ^[1-9][0-9]*$ ]] && [ "$1" -le "$2" ]; }

# Namespaces that are ours by name; nothing else is ever touched.
our_namespaces() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^(${NS_SWITCH}|${NS_PREFIX}[0-9]+)\$"
}

# tc's rate in bits per second: 1gbit -> 1000000000 (tc's k, m, g are powers of 10).
rate_bps() {
    local r=${1,,} mult=1 num
    [[ "$r" =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?)bit$ ]] || return 1
    num=${BASH_REMATCH[1]}
    case "${BASH_REMATCH[3]}" in
    k) mult=1000 ;; m) mult=1000000 ;; g) mult=1000000000 ;; t) mult=1000000000000 ;;
    esac
    awk -v n="$num" -v m="$mult" 'BEGIN { printf "%.0f\n", n * m }'
}

# A token bucket on one egress. The bucket holds 1 ms of traffic, at least
# 128 KiB: a smaller one makes TCP's 64 KiB GSO bursts wait for tokens and
# TCP stays well below RATE (64 KiB: 0.75 of 1gbit both ways at once). What
# the bucket holds is also a burst a real link does not grant: a link idle
# for 1 ms then sends up to 1 ms of data at once. The queue behind it holds
# 20 ms, enough for TCP to fill the link without losses.
shape() {
    local ns=$1 dev=$2 rate=$3 bps burst
    bps=$(rate_bps "$rate") || die "rate '$rate' is not a tc rate such as 1gbit, 10gbit, 500mbit"
    burst=$((bps / 8 / 1000))
    [ "$burst" -ge 131072 ] || burst=131072
    tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms ||
        { echo "netns.sh: tc qdisc on $dev in $ns failed" >&2; return 1; }
}

cmd_up() {
    [ $# -eq 2 ] || die "up wants H and RATE, e.g. up 2 1gbit"
    local nhosts=$1 rate=$2 h ns
    is_count "$nhosts" 250 || die "H must be 1 to 250, not '$nhosts'"
    if [ "$rate" != none ]; then
        command -v tc >/dev/null || die "tc not found (apt-get install iproute2)"
        rate_bps "$rate" >/dev/null || die "rate '$rate' is not a tc rate such as 1gbit, or none"
    fi
    cmd_down
    trap 'cmd_down; exit 1' ERR
    set -E
    ip netns add "$NS_SWITCH"
    ip -n "$NS_SWITCH" link set lo up
    # No STP: ports forward as soon as they are up instead of after 15 s.
    ip -n "$NS_SWITCH" link add "$BRIDGE" type bridge stp_state 0 forward_delay 0
    ip -n "$NS_SWITCH" link set "$BRIDGE" up
    for ((h = 0; h < nhosts; h++)); do
        ns=$NS_PREFIX$h
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        # Created inside the switch namespace with its peer put straight into the
        # host's, so that neither end ever appears in the caller's namespace.
        ip -n "$NS_SWITCH" link add "vs$h" type veth peer name "vh$h" netns "$ns"
        ip -n "$NS_SWITCH" link set "vs$h" master "$BRIDGE" up
        ip -n "$ns" addr add "$SUBNET.$((h + 1))/24" dev "vh$h"
        ip -n "$ns" link set "vh$h" up
        if [ "$rate" != none ]; then
            shape "$ns" "vh$h" "$rate"          # host -> switch
            shape "$NS_SWITCH" "vs$h" "$rate"   # switch -> host
        fi
    done
    trap - ERR
    set +E
    wait_reachable "$nhosts"
}

# Until the bridge forwards, the first connections would stall in SYN retries:
# wait until each host gets an answer (a refusal will do) from host 0.
wait_reachable() {
    local nhosts=$1 h
    for ((h = 1; h < nhosts; h++)); do
        ip netns exec "$NS_PREFIX$h" python3 -c "import socket, time
for _ in range(50):
    s = socket.socket(); s.settimeout(0.2)
    if s.connect_ex(('$SUBNET.1', 9)) in (0, 111): break
    s.close(); time.sleep(0.1)
else: raise SystemExit('host $h cannot reach $SUBNET.1')" ||
            { cmd_down; die "the switch does not forward"; }
    done
}

cmd_down() {
    local ns pids left
    for ns in $(our_namespaces); do
        # Ranks left by a killed driver keep a deleted namespace alive; end them.
        pids=$(ip netns pids "$ns" 2>/dev/null)
        if [ -n "$pids" ]; then
            kill -TERM $pids 2>/dev/null
            for ((left = 20; left > 0; left--)); do
                pids=$(ip netns pids "$ns" 2>/dev/null)
                [ -z "$pids" ] && break
                sleep 0.1
            done
            [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
        fi
        ip netns del "$ns" 2>/dev/null || echo "netns.sh: could not delete namespace $ns" >&2
    done
    return 0
}

cmd_status() {
    local ns
    for ns in $(our_namespaces); do
        echo "== $ns"
        ip -n "$ns" -brief addr show | grep -v '^lo '
        tc -n "$ns" qdisc show | grep -E 'tbf|htb|netem' | sed 's/^/   /'
    done
}

# The CPUs this shell may run on, in order (loomrun deals ranks onto the same list).
allowed_cpus() {
    local list part a b
    list=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status)
    for part in ${list//,/ }; do
        if [[ "$part" == *-* ]]; then
            a=${part%-*} b=${part#*-}
            seq "$a" "$b"
        else
            echo "$part"
        fi
    done
}

# A port nobody listens on at host 0's address. Only probed, like loomrun's:
# rank 0 binds it moments later with SO_REUSEADDR.
free_port() {
    local addr=$1 port
    port=$(ip netns exec "${NS_PREFIX}0" python3 -c "import socket
s = socket.socket(); s.bind(('$addr', 0)); print(s.getsockname()[1])" 2>/dev/null)
    echo "${port:-$((29500 + RANDOM % 1000))}"
}

cmd_exec() {
    local out="" timeout=600 bind=core
    while [ $# -gt 0 ]; do
        case "$1" in
        --out) out=$2; shift 2 ;;
        --timeout) timeout=$2; shift 2 ;;
        --bind) bind=$2; shift 2 ;;
        --) shift; break ;;
        -*) die "exec: unknown option '$1'" ;;
        *) break ;;
        esac
    done
    [ $# -ge 3 ] || die "exec wants H L PROG [ARGS...]"
    local nhosts=$1 nlocal=$2 prog=$3
    shift 3
    is_count "$nhosts" 250 || die "H must be 1 to 250, not '$nhosts'"
    is_count "$nlocal" 4096 || die "L must be 1 to 4096, not '$nlocal'"
    [[ "$timeout" =~ ^[1-9][0-9]*$ ]] || die "--timeout wants whole seconds, not '$timeout'"
    [ "$bind" = core ] || [ "$bind" = none ] || die "--bind wants core or none, not '$bind'"
    [ -x "$prog" ] || prog=$(command -v "$prog") || die "program '$3' not found or not executable"
    local h
    for ((h = 0; h < nhosts; h++)); do
        ip netns list | grep -q "^$NS_PREFIX$h\\b" ||
            die "namespace $NS_PREFIX$h is missing; run 'netns.sh up $nhosts RATE' first"
    done
    [ -n "$out" ] || out=$(mktemp -d /tmp/loom-hosts.XXXXXX)
    mkdir -p "$out" || die "cannot create $out"

    local nranks=$((nhosts * nlocal)) secret port r l cpu
    local -a cpus
    # Global, not local: the EXIT trap runs after this function has returned.
    pids=() status=() watchdog=""
    mapfile -t cpus < <(allowed_cpus)
    secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
    port=$(free_port "$SUBNET.1")
    rm -f "$out/timed_out"

    # Only ranks not yet reaped: a reaped rank's pid may already be another process's.
    stop_ranks() {
        local sig i live=()
        for ((i = 0; i < ${#pids[@]}; i++)); do
            [ -z "${status[i]:-}" ] && live+=("${pids[i]}")
        done
        [ ${#live[@]} -gt 0 ] || return 0
        for sig in TERM KILL; do
            kill -"$sig" "${live[@]}" 2>/dev/null || return 0
            for ((i = 0; i < 20; i++)); do
                kill -0 "${live[@]}" 2>/dev/null || return 0
                sleep 0.1
            done
        done
    }
    # Whatever ends this shell (a signal, a bug) takes the ranks and the watchdog along.
    # A second Ctrl-C must not cut that short.
    trap 'trap "" INT TERM HUP; stop_ranks; [ -n "$watchdog" ] && kill "$watchdog" 2>/dev/null' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM HUP

    for ((r = 0; r < nranks; r++)); do
        h=$((r / nlocal)) l=$((r % nlocal))
        local pin=()
        if [ "$bind" = core ]; then
            cpu=${cpus[$((r % ${#cpus[@]}))]}
            pin=(taskset -c "$cpu")
        fi
        ip netns exec "$NS_PREFIX$h" env \
            LOOM_RANK=$r LOOM_WORLD_SIZE=$nranks LOOM_LOCAL_RANK=$l LOOM_LOCAL_SIZE=$nlocal \
            LOOM_COMM_ID="$SUBNET.1:$port" LOOM_SECRET="$secret" LOOM_HOST_ID="host$h" \
            LOOM_SOCKET_IFNAME="=vh$h" "${pin[@]}" "$prog" "$@" \
            >"$out/rank$r.out" 2>"$out/rank$r.err" </dev/null &
        pids[r]=$!
    done

    # The watchdog marks the timeout before killing, so that the ranks' deaths
    # by SIGTERM are reported as what they are.
    (
        sleep "$timeout" &
        sp=$!
        trap 'kill $sp 2>/dev/null; exit 0' TERM
        # wait also returns on signals this subshell ignores (a Ctrl-C meant
        # for the ranks): only the sleep's end is a timeout.
        while kill -0 $sp 2>/dev/null; do wait $sp; done
        : >"$out/timed_out"
        kill -TERM "${pids[@]}" 2>/dev/null
        sleep 2
        kill -KILL "${pids[@]}" 2>/dev/null
    ) &
    watchdog=$!
    local left=$nranks first=-1 done_pid rc found
    while [ "$left" -gt 0 ]; do
        local live=()
        for ((r = 0; r < nranks; r++)); do
            [ -z "${status[r]:-}" ] && live+=("${pids[r]}")
        done
        done_pid=
        wait -n -p done_pid "${live[@]}" 2>/dev/null
        rc=$?
        found=()
        if [ -n "${done_pid:-}" ]; then
            found=("$done_pid:$rc")
        else
            # A rank that ended before this wait has left bash's job table, and
            # wait -n no longer sees it; plain wait still has its status.
            for done_pid in "${live[@]}"; do
                if ! kill -0 "$done_pid" 2>/dev/null; then
                    wait "$done_pid" 2>/dev/null
                    found+=("$done_pid:$?")
                fi
            done
            [ ${#found[@]} -gt 0 ] || sleep 0.1
        fi
        for done_pid in "${found[@]}"; do
            rc=${done_pid#*:}
            for ((r = 0; r < nranks; r++)); do
                [ "${pids[r]}" = "${done_pid%:*}" ] && break
            done
            status[r]=$rc
            left=$((left - 1))
            if [ "$rc" -ne 0 ] && [ "$first" -lt 0 ]; then
                first=$r
                # In the background, so that the other ranks' statuses are still collected.
                (stop_ranks) &
            fi
        done
    done
    kill -TERM "$watchdog" 2>/dev/null
    wait 2>/dev/null
    trap - INT TERM HUP EXIT

    cat "$out/rank0.out"
    if [ -e "$out/timed_out" ]; then
        echo "netns.sh: $nranks ranks of $prog timed out after $timeout s; killed" >&2
        first=-2
    elif [ "$first" -ge 0 ]; then
        echo "netns.sh: rank $first failed with status ${status[first]} (128+N: signal N)" >&2
    fi
    if [ "$first" -ne -1 ]; then
        for ((r = 0; r < nranks; r++)); do
            echo "---- rank $r (host $((r / nlocal)), status ${status[r]}): $out/rank$r.err" >&2
            tail -n 40 "$out/rank$r.err" >&2
        done
        [ "$first" -eq -2 ] && return 124
        return "${status[first]}"
    fi
    return 0
}

main() {
    case "${1:-}" in
    up) shift; need_root; cmd_up "$@" ;;
    down) shift; need_root; cmd_down ;;
    exec) shift; need_root; cmd_exec "$@" ;;
    status) shift; need_root; cmd_status ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
    esac
}

# One line, read whole before it runs: bash reads a script as it goes, so a
# copy of this file edited during a long exec must not be read any further.
main "$@"; exit $?
