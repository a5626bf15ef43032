#!/usr/bin/env bash
# Run a throw-away single-node Apache Kafka 4.x broker (KRaft, combined broker+controller)
# on loopback, for tests, CI, examples and benchmarks.
#
#   scripts/kafka.sh fetch    resolve the broker jars from Maven Central (cached in ~/.m2)
#   scripts/kafka.sh start    format a fresh KRaft storage dir, start the broker, wait until it serves
#   scripts/kafka.sh stop     stop the broker and remove its state dir
#   scripts/kafka.sh status   print KBS_KAFKA_* variables (exit 1 when not running)
#
# Environment:
#   KBS_KAFKA_DIR      state dir (default: <repo>/.kafka)
#   KBS_KAFKA_VERSION  Kafka version (default 4.1.1)
#   KBS_KAFKA_HEAP     JVM heap options (default -Xms256m -Xmx512m)
#   KBS_PYTHON         python with confluent-kafka, used for the readiness probe
#
# After `start`, $KBS_KAFKA_DIR/env holds shell-sourceable lines:
#   KBS_KAFKA_BOOTSTRAP=127.0.0.1:PORT  KBS_KAFKA_LOG_DIR=/path/to/log.dirs
#   KBS_KAFKA_PID=...  KBS_KAFKA_CONTROLLER=127.0.0.1:PORT  KBS_KAFKA_LOG=/path/server.log
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${KBS_KAFKA_DIR:-$REPO/.kafka}"
VERSION="${KBS_KAFKA_VERSION:-4.1.1}"
LOG4J_VERSION="2.24.3"
HEAP="${KBS_KAFKA_HEAP:--Xms256m -Xmx512m}"
# The jars live in ~/.m2 (Maven's own cache); the classpath file just lists them.
CACHE="${KBS_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kbs-kafka/$VERSION}"
CLASSPATH_FILE="$CACHE/classpath.txt"

if [[ -n "${KBS_PYTHON:-}" ]]; then
    PY="$KBS_PYTHON"
elif [[ -x "$REPO/.venv/bin/python" ]]; then
    PY="$REPO/.venv/bin/python"
else
    PY="python3"
fi

log() { echo "kafka.sh: $*" >&2; }

fetch() {
    if [[ -s "$CLASSPATH_FILE" ]] && all_jars_exist; then
        log "jars for Kafka $VERSION already resolved ($CLASSPATH_FILE)"
        return 0
    fi
    mkdir -p "$CACHE"
    # A tiny generated pom: kafka_2.13 pulls in kafka-server, -storage, -raft, -metadata,
    # -group-coordinator, ... transitively; log4j2 is the logging backend the broker expects.
    cat >"$CACHE/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>fsspec-kbs</groupId>
  <artifactId>kafka-broker-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-server</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-storage</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-metadata</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-raft</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF
    log "resolving Kafka $VERSION broker jars from Maven Central (cache: ~/.m2)"
    # build-classpath lists the jars in the local repository: no copy, repeat runs are offline-fast.
    mvn -q -B -f "$CACHE/pom.xml" dependency:build-classpath \
        -Dmdep.includeScope=runtime -Dmdep.outputFile="$CLASSPATH_FILE.tmp" >&2
    mv "$CLASSPATH_FILE.tmp" "$CLASSPATH_FILE"
    log "classpath written to $CLASSPATH_FILE"
}

all_jars_exist() {
    local jar
    IFS=':' read -r -a jars <"$CLASSPATH_FILE"
    for jar in "${jars[@]}"; do
        [[ -f "$jar" ]] || return 1
    done
}

free_port() {
    "$PY" -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

is_running() {
    [[ -f "$STATE/pid" ]] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null
}

start() {
    if is_running; then
        log "already running"
        cat "$STATE/env"
        return 0
    fi
    fetch
    # A free port can be taken by someone else between our probe and the broker's bind:
    # try again with new ports when the broker dies during startup.
    local attempt
    for attempt in 1 2 3; do
        if start_once; then
            return 0
        fi
        log "start attempt $attempt failed"
        [[ -f "$STATE/stdout.log" ]] && tail -n 20 "$STATE/stdout.log" >&2
    done
    return 1
}

start_once() {
    rm -rf "$STATE"
    mkdir -p "$STATE/data"
    local port cport cluster_id cp
    port="$(free_port)"
    cport="$(free_port)"
    while [[ "$cport" == "$port" ]]; do cport="$(free_port)"; done
    cluster_id="$("$PY" -c 'import base64, uuid
print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')"
    cp="$(cat "$CLASSPATH_FILE")"

    cat >"$STATE/server.properties" <<EOF
process.roles=broker,controller
node.id=1
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
controller.quorum.bootstrap.servers=127.0.0.1:$cport
log.dirs=$STATE/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.flush.interval.messages=9223372036854775807
# Tests and benchmarks replay records with 2023 timestamps: time retention (7 days by default,
# checked every 5 min) deleted them mid-run, a flaky "missing records" in CI and the benchmark.
log.retention.ms=-1
num.network.threads=2
num.io.threads=4
background.threads=4
EOF
    cat >"$STATE/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $STATE/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
    local jvm=(java $HEAP -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
        -Dlog4j2.configurationFile="$STATE/log4j2.properties" -cp "$cp")
    log "formatting KRaft storage in $STATE/data (cluster id $cluster_id)"
    "${jvm[@]}" kafka.tools.StorageTool format --standalone -t "$cluster_id" \
        -c "$STATE/server.properties" >"$STATE/format.log" 2>&1 || {
        cat "$STATE/format.log" >&2
        return 1
    }
    log "starting broker on 127.0.0.1:$port (controller 127.0.0.1:$cport)"
    nohup "${jvm[@]}" kafka.Kafka "$STATE/server.properties" >"$STATE/stdout.log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$STATE/pid"
    cat >"$STATE/env" <<EOF
KBS_KAFKA_BOOTSTRAP=127.0.0.1:$port
KBS_KAFKA_CONTROLLER=127.0.0.1:$cport
KBS_KAFKA_LOG_DIR=$STATE/data
KBS_KAFKA_PID=$pid
KBS_KAFKA_LOG=$STATE/server.log
KBS_KAFKA_VERSION=$VERSION
EOF
    # Ready = a metadata request through a real client succeeds (the log line alone does not
    # guarantee the broker listener is registered with the controller yet).
    local deadline=$((SECONDS + ${KBS_KAFKA_START_TIMEOUT:-90}))
    # The cluster id must be ours: if someone else grabbed the port first, our broker dies on
    # bind while the probe would happily talk to theirs.
    until "$PY" - "127.0.0.1:$port" "$cluster_id" <<'EOF' 2>/dev/null; do
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1], "socket.timeout.ms": 2000}).list_topics(timeout=2)
sys.exit(0 if md.brokers and md.cluster_id == sys.argv[2] else 1)
EOF
        if ! kill -0 "$pid" 2>/dev/null; then
            log "broker exited during startup; last log lines:"
            tail -n 40 "$STATE/server.log" >&2 2>/dev/null || true
            return 1
        fi
        if ((SECONDS > deadline)); then
            log "broker did not become ready in time"
            kill -KILL "$pid" 2>/dev/null || true
            return 1
        fi
        sleep 0.5
    done
    log "ready"
    cat "$STATE/env"
}

stop() {
    if [[ -f "$STATE/pid" ]]; then
        local pid
        pid="$(cat "$STATE/pid")"
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            # Controlled shutdown of a single node is quick; do not wait forever.
            for _ in $(seq 1 60); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.25
            done
            if kill -0 "$pid" 2>/dev/null; then
                log "broker did not stop after SIGTERM, killing"
                kill -KILL "$pid" 2>/dev/null || true
            fi
        fi
    fi
    # Only remove a directory that we created (it has our marker files).
    if [[ -f "$STATE/server.properties" || -f "$STATE/pid" ]]; then
        rm -rf "$STATE"
    fi
    log "stopped"
}

status() {
    if is_running; then
        cat "$STATE/env"
    else
        log "not running"
        return 1
    fi
}

case "${1:-}" in
fetch) fetch ;;
start) start ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 fetch|start|stop|status" >&2
    exit 2
    ;;
esac
