# One image for every pybk process on Kubernetes:
#   pybk bookie (via /usr/local/bin/bookie-entrypoint), pybk autorecovery, pybk operator.
# Build: docker build -t pybk:0.1.0 .      (kind: kind load docker-image pybk:0.1.0)
FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip build
COPY pyproject.toml README.md ./
COPY pybk ./pybk
RUN python -m build --wheel --outdir /wheels .

FROM python:3.11-slim AS pybk
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/pybk-*.whl)[operator,uvloop]" && rm -rf /wheels \
    && groupadd --gid 10001 pybk && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin pybk \
    && mkdir -p /pybk/journal /pybk/ledgers /opt/pybk/crds && chown -R 10001:10001 /pybk
# The CRD travels with the image so `pybk operator --check` works inside it.
COPY crds/ /opt/pybk/crds/
COPY bookie_image/entrypoint.sh /usr/local/bin/bookie-entrypoint
# Logs are JSON lines in the image (one object per line, for log collectors); set
# PYBK_LOG_FORMAT=text on a pod for lines meant for people.
ENV PYBK_CRD=/opt/pybk/crds/bookiecluster.yaml PYBK_LOG_FORMAT=json
USER 10001:10001
EXPOSE 3181 8000 8080
ENTRYPOINT []
CMD ["pybk", "--help"]

# Spark jobs over ledgers in the cluster (driver and executor pods):
#   docker build --target spark -t pybk-spark:0.1.0 .
# Java 17, PySpark with the sql extra, pybk, pybk's Spark jar (its JVM log reader, compiled here
# with a JDK that is removed again; spark-submit puts it on the classpath: pybk.spark.submit), the
# example jobs under /opt/pybk/spark, and an entrypoint that runs `driver` and `executor` as
# Spark's own Kubernetes images do.
FROM python:3.11-slim AS spark
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYSPARK_PYTHON=python PYSPARK_DRIVER_PYTHON=python \
    PYBK_SPARK_JAR=/opt/pybk/pybk-spark.jar
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
    && pip install --no-cache-dir "$(ls /wheels/pybk-*.whl)[spark,uvloop]" && rm -rf /wheels \
    && mkdir -p /opt/pybk && PYBK_SPARK_JAR= PYBK_CACHE_DIR=/tmp/pybk-jar python -m pybk.spark.jvm > /tmp/jar \
    && cp "$(cat /tmp/jar)" "$PYBK_SPARK_JAR" && rm -rf /tmp/pybk-jar /tmp/jar \
    && apt-get purge -y openjdk-17-jdk-headless && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 pybk && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin pybk \
    && mkdir -p /opt/spark/work-dir /opt/pybk/spark && chown 10001:10001 /opt/spark/work-dir
COPY spark/ledger_stats.py spark/export_parquet.py spark/log_counts.py /opt/pybk/spark/
COPY spark_image/entrypoint.sh /usr/local/bin/spark-entrypoint
WORKDIR /opt/spark/work-dir
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/spark-entrypoint"]

# The last stage is what a plain `docker build .` makes: keep that the pybk image above.
FROM pybk
