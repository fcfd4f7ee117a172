#!/bin/sh
# Entrypoint of the sample device agent (docker-compose.yml, deploy/k8s/agent.yaml).
#
# First start: enroll this device through the REST API (POST /v1/devices, with `python3 -m
# device_agent.enrollment`: the device-only image has no `orrery devices`) with the admin key, and
# keep the device token in the agent's data directory, a volume.
# Every start: run `orrery agent` with that token, so a restarted container is the same device and
# finds its ledger again (SPEC section 4: a batch never runs twice across agent restarts).
#
# Environment: ORRERY_AGENT_SERVER (orchestrator http(s) URL), ORRERY_AGENT_DATA_DIR, and either
# ORRERY_AGENT_TOKEN (an enrolled device: no enrollment, no admin key needed) or ORRERY_ADMIN_KEY.
# ENROLL_NAME names the device (default: the host name), ENROLL_TRIES bounds the wait for the
# orchestrator (default 60, two seconds apart). Arguments are passed on to `orrery agent`.
#
# A device of that name already enrolled, and no token here (the data volume was lost): the agent
# takes that device over by giving it a new token (POST /v1/devices/NAME/token), so the old
# token stops working and a connection still open with it is closed (4401); the device keeps its
# id, labels and history. Its ledger went with the volume, so a batch it held when the volume was
# lost ends as the orchestrator decides for a device that lost its ledger (never run twice).
# ENROLL_ON_CONFLICT=fail stops instead, at once.
set -eu

# `orrery-agent-entrypoint --healthy`: the image's HEALTHCHECK (is the agent connected?).
if [ "${1:-}" = --healthy ]; then
    exec python3 -m device_agent.health "${ORRERY_AGENT_DATA_DIR:-/var/lib/orrery-agent}"
fi

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
    done_as=enrolled
    # The key goes through the environment, not argv, so it does not show in the process list.
    until api enroll "$name"; do
        if grep -q '^error conflict:' "$data_dir/enroll.err"; then
            take_over "$name"
            done_as="took over"
            break
        fi
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
    echo "orrery-agent-entrypoint: $done_as device '$name'; its token is kept in $token_file"
}

# One REST call with the admin key (device_agent/enrollment.py); the answer in enroll.json, errors in enroll.err.
api() {
    ORRERY_URL="$ORRERY_AGENT_SERVER" ORRERY_API_KEY="$ORRERY_ADMIN_KEY" \
        python3 -m device_agent.enrollment "$@" >"$data_dir/enroll.json" 2>"$data_dir/enroll.err"
}

take_over() {
    if [ "${ENROLL_ON_CONFLICT:-takeover}" = fail ]; then
        echo "orrery-agent-entrypoint: a device named '$1' is already enrolled and there is no token for it" \
            "in $data_dir (ENROLL_ON_CONFLICT=fail):" >&2
        cat "$data_dir/enroll.err" >&2
        exit 1
    fi
    echo "orrery-agent-entrypoint: a device named '$1' is already enrolled and there is no token for it in" \
        "$data_dir (a lost volume?): taking it over with a new token; its old token stops working"
    if ! api take-over "$1"; then
        echo "orrery-agent-entrypoint: could not give device '$1' a new token:" >&2
        cat "$data_dir/enroll.err" >&2
        exit 1
    fi
}

if [ -z "${ORRERY_AGENT_TOKEN:-}" ]; then
    [ -s "$token_file" ] || enroll
    ORRERY_AGENT_TOKEN=$(cat "$token_file")
    export ORRERY_AGENT_TOKEN
fi
unset ORRERY_ADMIN_KEY ENROLL_NAME ENROLL_TRIES # the agent itself needs only its device token
exec orrery agent "$@"
