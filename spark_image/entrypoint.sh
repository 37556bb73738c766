#!/bin/bash
# Entrypoint of the pybk Spark image (Dockerfile target `spark`): what Spark's own Kubernetes
# images do, for a pip-installed PySpark (which ships no Kubernetes entrypoint).
#   driver ARGS...   the driver pod Spark creates in cluster mode (Spark operator, spark-submit
#                    --deploy-mode cluster): spark-submit --deploy-mode client, bound to the pod IP
#                    Spark puts in SPARK_DRIVER_BIND_ADDRESS.
#   executor         an executor pod Spark's driver creates: the JVM executor backend, configured
#                    by the SPARK_* variables Spark sets on the pod.
#   anything else    run as given (e.g. `spark-submit --deploy-mode client ...` in a Job).
# PYBK_SPARK_DRY_RUN=1 prints the command, one argument per line, instead of running it.
set -euo pipefail

fail() { echo "spark-entrypoint: $*" >&2; exit 2; }

SPARK_HOME="${SPARK_HOME:-$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}"
export SPARK_HOME
JAVA="${JAVA_HOME:+${JAVA_HOME}/bin/}java"

CLASSPATH_="${SPARK_CLASSPATH:-}:${SPARK_HOME}/jars/*"
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then CLASSPATH_="${CLASSPATH_}:${SPARK_EXTRA_CLASSPATH}"; fi
if [ -n "${HADOOP_CONF_DIR:-}" ]; then CLASSPATH_="${HADOOP_CONF_DIR}:${CLASSPATH_}"; fi
CLASSPATH_="${SPARK_CONF_DIR:-${SPARK_HOME}/conf}:${CLASSPATH_}:${PWD}"

# SPARK_JAVA_OPT_0, _1, ... in numeric order: the executor's JVM options.
java_opts() {
    local n=0
    while printenv "SPARK_JAVA_OPT_${n}" >/dev/null; do
        JAVA_OPTS+=("$(printenv "SPARK_JAVA_OPT_${n}")")
        n=$((n + 1))
    done
}

case "${1:-}" in
    driver)
        shift
        : "${SPARK_DRIVER_BIND_ADDRESS:?SPARK_DRIVER_BIND_ADDRESS must be set (Spark sets it to the pod IP)}"
        CMD=("${SPARK_HOME}/bin/spark-submit"
             --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}"
             --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}"
             --deploy-mode client "$@")
        ;;
    executor)
        shift
        for var in SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_EXECUTOR_MEMORY \
                   SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP SPARK_EXECUTOR_POD_NAME; do
            [ -n "${!var:-}" ] || fail "${var} is not set: executor pods get it from Spark's driver"
        done
        JAVA_OPTS=()
        java_opts
        CMD=("${JAVA}" "${JAVA_OPTS[@]}"
             "-Xms${SPARK_EXECUTOR_MEMORY}" "-Xmx${SPARK_EXECUTOR_MEMORY}"
             -cp "${CLASSPATH_}:${SPARK_DIST_CLASSPATH:-}"
             org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend
             --driver-url "${SPARK_DRIVER_URL}"
             --executor-id "${SPARK_EXECUTOR_ID}"
             --cores "${SPARK_EXECUTOR_CORES}"
             --app-id "${SPARK_APPLICATION_ID}"
             --hostname "${SPARK_EXECUTOR_POD_IP}"
             --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}"
             --podName "${SPARK_EXECUTOR_POD_NAME}")
        ;;
    "")
        fail "no command: expected driver, executor or a command to run"
        ;;
    *)
        CMD=("$@")
        ;;
esac

if [ "${PYBK_SPARK_DRY_RUN:-0}" != "0" ]; then
    printf '%s\n' "${CMD[@]}"
    exit 0
fi
# tini reaps the Python workers Spark forks and forwards signals, as in Spark's images.
if command -v tini >/dev/null; then
    exec tini -s -- "${CMD[@]}"
fi
exec "${CMD[@]}"
