#!/usr/bin/env bash
# Resolve Spark's own Kafka source (spark-sql-kafka-0-10_2.13, matched to the installed pyspark)
# and its runtime dependencies from Maven Central, for the tests and benchmarks that compare
# format("kbs") with format("kafka") or back up through it. Prints a comma-separated jar list
# (for spark.jars) and caches it in $CACHE/jars.txt.
#
#   scripts/spark_kafka_jars.sh            print the jar list (resolving it once)
#
# Environment: KBS_PYTHON (python with pyspark), KBS_SPARK_KAFKA_VERSION (default: pyspark's).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${KBS_PYTHON:-}" ]]; then PY="$KBS_PYTHON"
elif [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"
else PY="python3"; fi
VERSION="${KBS_SPARK_KAFKA_VERSION:-$("$PY" -c 'import pyspark; print(pyspark.__version__)')}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kbs-spark-kafka/$VERSION"
OUT="$CACHE/jars.txt"

all_exist() {
    local jar
    IFS=',' read -r -a jars <"$OUT"
    for jar in "${jars[@]}"; do [[ -f "$jar" ]] || return 1; done
}

if [[ ! -s "$OUT" ]] || ! all_exist; then
    mkdir -p "$CACHE"
    # spark-sql and the other Spark modules are "provided" (pyspark ships them): runtime scope
    # leaves them out and keeps kafka-clients, commons-pool2 and the token provider.
    cat >"$CACHE/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>fsspec-kbs</groupId>
  <artifactId>spark-kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-sql-kafka-0-10_2.13</artifactId><version>$VERSION</version></dependency>
  </dependencies>
</project>
POM
    echo "spark_kafka_jars.sh: resolving spark-sql-kafka-0-10_2.13:$VERSION from Maven Central" >&2
    mvn -q -B -f "$CACHE/pom.xml" dependency:build-classpath \
        -Dmdep.includeScope=runtime -Dmdep.pathSeparator=, -Dmdep.outputFile="$OUT.tmp" >&2
    # Keep only what pyspark does not ship already (two scala-library or slf4j jars on one
    # classpath fail in confusing ways): compare artifact names with pyspark's jars directory.
    SPARK_JARS="$("$PY" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
    "$PY" - "$OUT.tmp" "$SPARK_JARS" >"$OUT" <<'PYEOF'
import os, re, sys
listed, spark_jars = sys.argv[1], sys.argv[2]
def artifact(name: str) -> str:
    return re.sub(r"-\d[^-]*(-[A-Za-z0-9.]+)?\.jar$", "", os.path.basename(name))
shipped = {artifact(j) for j in os.listdir(spark_jars)}
jars = [j for j in open(listed).read().strip().split(",") if j and artifact(j) not in shipped]
print(",".join(jars), end="")
PYEOF
    rm -f "$OUT.tmp"
fi
cat "$OUT"
echo
