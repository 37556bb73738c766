#!/bin/sh
# Start `pybk bookie` inside a BookieCluster pod: derive what the pod itself knows.
#   bookie id : <pod>.<headless service>.<namespace>.svc:<grpc port>  (stable across restarts)
#   host      : the pod IP (listen and advertise; the id stays the DNS name)
#   zone      : the node's zone, copied onto the pod by the operator (pybk.io/zone annotation)
# Every other option comes from PYBK_* variables set by the StatefulSet (spec.config included).
set -eu

: "${POD_NAME:?POD_NAME must be set (downward API metadata.name)}"
: "${POD_NAMESPACE:?POD_NAMESPACE must be set (downward API metadata.namespace)}"
: "${PYBK_SERVICE:?PYBK_SERVICE must name the headless Service}"

PYBK_PORT="${PYBK_PORT:-3181}"
export PYBK_PORT
PYBK_BOOKIE_ID="${PYBK_BOOKIE_ID:-${POD_NAME}.${PYBK_SERVICE}.${POD_NAMESPACE}.svc:${PYBK_PORT}}"
export PYBK_BOOKIE_ID
PYBK_HOST="${PYBK_HOST:-${POD_IP:-0.0.0.0}}"
export PYBK_HOST

if [ -z "${PYBK_ZONE:-}" ] && [ "${PYBK_ZONE_WAIT:-0}" != "0" ]; then
    PYBK_ZONE="$(python -m pybk.operator.podzone --wait "${PYBK_ZONE_WAIT}" || true)"
fi
PYBK_ZONE="${PYBK_ZONE:-}"
export PYBK_ZONE

if [ "${PYBK_LOG_FORMAT:-text}" = json ]; then
    printf '{"timestamp": "%s", "level": "INFO", "logger": "bookie-entrypoint", "message": "id=%s host=%s zone=%s"}\n' \
        "$(date -u +%Y-%m-%dT%H:%M:%S.000Z)" "${PYBK_BOOKIE_ID}" "${PYBK_HOST}" "${PYBK_ZONE:-<none>}" >&2
else
    echo "bookie-entrypoint: id=${PYBK_BOOKIE_ID} host=${PYBK_HOST} zone=${PYBK_ZONE:-<none>}" >&2
fi
exec pybk bookie "$@"
