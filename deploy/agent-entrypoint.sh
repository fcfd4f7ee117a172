#!/bin/sh
# Entrypoint of the sample device agent (docker-compose.yml, deploy/k8s/agent.yaml).
#
# First start: enroll this device through the REST API (POST /v1/devices, via `orrery devices
# enroll`) with the admin key, and keep the device token in the agent's data directory, a volume.
# Every start: run `orrery agent` with that token, so a restarted container is the same device and
# finds its ledger again (SPEC section 4: a batch never runs twice across agent restarts).
#
# Environment: ORRERY_AGENT_SERVER (orchestrator http(s) URL), ORRERY_AGENT_DATA_DIR, and either
# ORRERY_AGENT_TOKEN (an enrolled device: no enrollment, no admin key needed) or ORRERY_ADMIN_KEY.
# ENROLL_NAME names the device (default: the host name), ENROLL_TRIES bounds the wait for the
# orchestrator (default 60, two seconds apart). Arguments are passed on to `orrery agent`.
set -eu

: "${ORRERY_AGENT_SERVER:?set ORRERY_AGENT_SERVER to the orchestrator URL, e.g. http://lb:8765}"
data_dir="${ORRERY_AGENT_DATA_DIR:-/var/lib/orrery-agent}"
token_file="$data_dir/device.token"
umask 077
mkdir -p "$data_dir"

enroll() {
    : "${ORRERY_ADMIN_KEY:?set ORRERY_ADMIN_KEY (to enroll this device) or ORRERY_AGENT_TOKEN (an enrolled one)}"
    name="${ENROLL_NAME:-$(uname -n)}"
    tries="${ENROLL_TRIES:-60}"
    n=1
    # The key goes through the environment, not argv, so it does not show in the process list.
    until ORRERY_URL="$ORRERY_AGENT_SERVER" ORRERY_API_KEY="$ORRERY_ADMIN_KEY" \
        orrery devices enroll "$name" --json >"$data_dir/enroll.json" 2>"$data_dir/enroll.err"; do
        if [ "$n" -ge "$tries" ]; then
            echo "orrery-agent-entrypoint: enrollment failed after $n tries:" >&2
            cat "$data_dir/enroll.err" >&2
            exit 1
        fi
        n=$((n + 1))
        sleep 2
    done
    token=$(sed -n 's/^ *"token": *"\([^"]*\)".*$/\1/p' "$data_dir/enroll.json")
    rm -f "$data_dir/enroll.json" "$data_dir/enroll.err"
    if [ -z "$token" ]; then
        echo "orrery-agent-entrypoint: the enrollment answer carried no token" >&2
        exit 1
    fi
    printf '%s\n' "$token" >"$token_file.tmp"
    mv "$token_file.tmp" "$token_file"
    echo "orrery-agent-entrypoint: enrolled device '$name'; its token is kept in $token_file"
}

if [ -z "${ORRERY_AGENT_TOKEN:-}" ]; then
    [ -s "$token_file" ] || enroll
    ORRERY_AGENT_TOKEN=$(cat "$token_file")
    export ORRERY_AGENT_TOKEN
fi
unset ORRERY_ADMIN_KEY ENROLL_NAME ENROLL_TRIES # the agent itself needs only its device token
exec orrery agent "$@"
