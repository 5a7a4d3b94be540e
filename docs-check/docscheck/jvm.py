"""Kotlin and Java blocks: each block is the one source file of a scratch
Maven module that depends on ``dev.openshell:openshell-sdk`` as a user gets
it: the artifact ``make jvm-install`` put into the local Maven repository (a
jar with the native library inside, loaded from the classpath). One reactor
build compiles and packages every module (``mvn -q verify``), then each block's ``main``
runs with ``java`` against the check's cluster. A block that starts a
``LocalCluster`` of its own also gets ``dev.openshell:openshell-gateway-bin``
as a user adds it, and runs without ``OPENSHELL_GATEWAY_BIN``, without the
build's directories on ``PATH`` and with a fresh cache directory: the gateway
it starts is the one unpacked from that jar."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import time

from .blocks import Block
from .common import SNIPPET_TIMEOUT, CheckFailed
from .context import Context, run_logged, write_if_changed
from .gateways import block_env

JVM_LANGS = {"kotlin", "java"}
KOTLIN_VERSION = "2.2.21"
ARTIFACT = ("dev.openshell", "openshell-sdk", "0.1.0-SNAPSHOT")
GATEWAY_BIN_ARTIFACT = "openshell-gateway-bin"

PARENT = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by docs-check (docscheck/jvm.py). -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>docscheck</groupId>
  <artifactId>readme-blocks</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <properties>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
    <maven.compiler.release>17</maven.compiler.release>
    <kotlin.compiler.jvmTarget>17</kotlin.compiler.jvmTarget>
  </properties>
  <modules>
{modules}
  </modules>
  <dependencies>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{gateway_bin}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.jetbrains.kotlin</groupId>
        <artifactId>kotlin-maven-plugin</artifactId>
        <version>{kotlin}</version>
        <executions>
          <execution>
            <id>compile</id>
            <goals><goal>compile</goal></goals>
            <configuration>
              <sourceDirs><sourceDir>${{project.basedir}}/src/main/kotlin</sourceDir></sourceDirs>
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
"""

MODULE = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <parent>
    <groupId>docscheck</groupId>
    <artifactId>readme-blocks</artifactId>
    <version>1</version>
  </parent>
  <artifactId>{name}</artifactId>
</project>
"""


def main_class(block: Block) -> tuple[str, str]:
    """The block's source file name and the class whose ``main`` runs."""
    package = re.search(r"^package\s+([\w.]+)", block.text, re.MULTILINE)
    prefix = f"{package.group(1)}." if package else ""
    if block.lang == "java":
        found = re.search(r"public\s+(?:final\s+)?class\s+(\w+)", block.text)
        if not found:
            raise CheckFailed(f"{block.where}: a java block needs a public class with main")
        return f"{found.group(1)}.java", prefix + found.group(1)
    return "Main.kt", prefix + "MainKt"


def run_env(ctx: Context, block: Block) -> dict[str, str]:
    """The block's environment; for a ``LocalCluster`` block, one where only
    the bundled gateway can be found."""
    env = block_env(ctx, block)
    if "LocalCluster" not in block.text:
        return env
    env = dict(env)
    env.pop("OPENSHELL_GATEWAY_BIN", None)
    path = [d for d in env.get("PATH", "").split(os.pathsep) if d]
    env["PATH"] = os.pathsep.join(
        d for d in path if not (pathlib.Path(d) / "openshell-gateway").exists()
    )
    cache = ctx.work / "jvm-cache" / block.name
    shutil.rmtree(cache, ignore_errors=True)
    env["XDG_CACHE_HOME"] = str(cache)
    return env


def maven() -> str:
    return os.environ.get("MVN") or shutil.which("mvn") or "mvn"


def check_jvm(ctx: Context, blocks: list[Block]) -> None:
    """Compiles every Kotlin and Java block in one reactor build, then runs each."""
    if not blocks:
        return
    base = ctx.work / "jvm"
    modules = []
    for block in blocks:
        module = base / block.name
        source, _ = main_class(block)
        kind = "kotlin" if block.lang == "kotlin" else "java"
        write_if_changed(module / "pom.xml", MODULE.format(name=block.name))
        write_if_changed(module / "src" / "main" / kind / source, block.text)
        modules.append(f"    <module>{block.name}</module>")
    group, artifact, version = ARTIFACT
    parent = PARENT.format(
        modules="\n".join(modules),
        group=group,
        artifact=artifact,
        version=version,
        kotlin=KOTLIN_VERSION,
        gateway_bin=GATEWAY_BIN_ARTIFACT,
    )
    write_if_changed(base / "pom.xml", parent)
    log = ctx.work / "logs" / "jvm-compile.log"
    started = time.monotonic()
    argv = [
        maven(),
        "-q",
        "-B",
        "verify",
        "dependency:build-classpath",
        "-Dmdep.outputFile=classpath.txt",
    ]
    rc = run_logged(argv, ctx, log, SNIPPET_TIMEOUT * 2, cwd=base)
    if rc != 0:
        for block in blocks:
            ctx.report(block, "FAIL", f"mvn verify: exit {rc} (see {log})")
        return
    print(f"check-docs: compiled {len(blocks)} JVM blocks ({time.monotonic() - started:.1f} s)")
    for block in blocks:
        module = base / block.name
        _, cls = main_class(block)
        classpath = [str(module / "target" / "classes")]
        classpath.append((module / "classpath.txt").read_text().strip())
        run_log = ctx.work / "logs" / f"{block.name}.log"
        started = time.monotonic()
        argv = ["java", "-cp", os.pathsep.join(classpath), cls]
        rc = run_logged(argv, ctx, run_log, SNIPPET_TIMEOUT, env=run_env(ctx, block), cwd=module)
        took = f"({time.monotonic() - started:.1f} s)"
        ctx.report(block, "ok" if rc == 0 else "FAIL", took if rc == 0 else f"exit {rc}")
