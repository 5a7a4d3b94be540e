#!/usr/bin/env bash
# `make check-jvm-consumer`: the JVM SDK as a user's Maven project gets it.
# Installs dev.openshell:openshell-sdk (with the debug native library inside)
# into the default local repository (~/.m2, or -Dmaven.repo.local through
# MAVEN_ARGS), makes a fresh project under the target dir whose sources are
# the Kotlin and Java quick starts of sdk-jvm/README.md, compiles them
# against the installed jar and runs both on a 3-replica cluster started
# here (`openshell-gateway up` on a free loopback port), stopped by its PID.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
MVN="${MVN:-mvn}"
WORK="$TARGET_DIR/jvm/consumer"
rm -rf "$WORK"
mkdir -p "$WORK/src/main/kotlin" "$WORK/src/main/java"

echo "check-jvm-consumer: installing the artifact"
(cd "$ROOT/sdk-jvm" && $MVN -q -B install -DskipTests -Dopenshell.target.dir="$TARGET_DIR" ${MAVEN_ARGS:-})

# The README's blocks, as they are written.
python3 - "$ROOT/sdk-jvm/README.md" "$WORK" <<'PY'
import re, sys
from pathlib import Path
text = Path(sys.argv[1]).read_text()
work = Path(sys.argv[2])
blocks = re.findall(r"^```(kotlin|java)\n(.*?)^```", text, re.S | re.M)
kinds = [k for k, _ in blocks]
if kinds != ["kotlin", "java"]:
    sys.exit(f"check-jvm-consumer: expected one kotlin and one java block, found {kinds}")
for kind, body in blocks:
    if kind == "kotlin":
        (work / "src/main/kotlin/QuickStart.kt").write_text(body)
    else:
        name = re.search(r"public class (\w+)", body).group(1)
        (work / f"src/main/java/{name}.java").write_text(body)
PY

cat > "$WORK/pom.xml" <<'POM'
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 https://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>example</groupId>
  <artifactId>openshell-consumer</artifactId>
  <version>1</version>
  <properties>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
    <maven.compiler.release>17</maven.compiler.release>
    <kotlin.version>2.2.21</kotlin.version>
    <kotlin.compiler.jvmTarget>17</kotlin.compiler.jvmTarget>
  </properties>
  <dependencies>
    <dependency>
      <groupId>dev.openshell</groupId>
      <artifactId>openshell-sdk</artifactId>
      <version>0.1.0-SNAPSHOT</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.jetbrains.kotlin</groupId>
        <artifactId>kotlin-maven-plugin</artifactId>
        <version>${kotlin.version}</version>
        <executions>
          <execution>
            <id>compile</id>
            <goals><goal>compile</goal></goals>
            <configuration>
              <sourceDirs><sourceDir>${project.basedir}/src/main/kotlin</sourceDir></sourceDirs>
            </configuration>
          </execution>
        </executions>
      </plugin>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-compiler-plugin</artifactId>
        <version>3.14.1</version>
      </plugin>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>3.8.1</version>
      </plugin>
    </plugins>
  </build>
</project>
POM

echo "check-jvm-consumer: compiling the quick starts"
(cd "$WORK" && $MVN -q -B compile dependency:build-classpath -Dmdep.outputFile=classpath.txt ${MAVEN_ARGS:-})
CLASSPATH_RUN="$WORK/target/classes:$(cat "$WORK/classpath.txt")"

PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
LOG="$WORK/cluster.log"
"$TARGET_DIR/debug/openshell-gateway" up --replicas 3 --listen "127.0.0.1:$PORT" \
  --data-dir "$WORK/data" --restart never </dev/null >"$LOG" 2>&1 &
CLUSTER_PID=$!
stop_cluster() {
  kill -INT "$CLUSTER_PID" 2>/dev/null || true
  wait "$CLUSTER_PID" 2>/dev/null || true
}
trap stop_cluster EXIT
for _ in $(seq 1 1200); do
  grep -q " serving http://" "$LOG" && break
  kill -0 "$CLUSTER_PID" 2>/dev/null || { cat "$LOG"; echo "check-jvm-consumer: the cluster exited"; exit 1; }
  sleep 0.1
done
grep -q " serving http://" "$LOG" || { cat "$LOG"; echo "check-jvm-consumer: no cluster within 120 s"; exit 1; }

export OPENSHELL_ENDPOINT="http://127.0.0.1:$PORT"
unset OPENSHELL_TOKEN
for main in QuickStartKt QuickStart; do
  echo "check-jvm-consumer: java $main"
  out="$(java -cp "$CLASSPATH_RUN" "$main")"
  echo "$out"
  case "$main" in
    QuickStartKt) expect=("hello (exit 0)" "streamed" "exit 3") ;;
    QuickStart) expect=("hello from java (exit 0)" "gone: not_found") ;;
  esac
  for line in "${expect[@]}"; do
    grep -qxF "$line" <<<"$out" || { echo "check-jvm-consumer: $main did not print '$line'"; exit 1; }
  done
done
echo "check-jvm-consumer: ok"
