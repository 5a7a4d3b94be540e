package dev.openshell.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.openshell.sdk.ffi.ExecEvent;
import dev.openshell.sdk.ffi.OpenShellException;
import dev.openshell.sdk.ffi.WatchEvent;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** The Java facade's tty resize, files, logs, watches, forward and SSH session calls. */
class JavaForwardFilesTest {
  private static <T extends Throwable> T cause(Class<T> type, Executable call) {
    ExecutionException failed = assertThrows(ExecutionException.class, call::run);
    return assertInstanceOf(type, failed.getCause());
  }

  interface Executable {
    void run() throws Exception;
  }

  @Test
  void filesLogsWatchForwardAndSshFromJava() throws Exception {
    ClientConfig config =
        ClientConfig.builder(TestCluster.INSTANCE.getEndpoint())
            .defaultTimeout(Duration.ofSeconds(60))
            .build();
    try (OpenShellAsyncClient client = OpenShellAsyncClient.connect(config).get()) {
      String name = "jvm-java-io-" + UUID.randomUUID().toString().substring(0, 8);
      client.createSandbox(SandboxSpec.builder().name(name).label("suite", "jvm").build()).get();
      client.waitReady(name).get();
      try {
        byte[] note = "from java\n".getBytes(StandardCharsets.UTF_8);
        assertEquals(note.length, client.writeFile(name, "java.txt", note).get().getBytes());
        assertEquals(
            "from java\n",
            new String(client.readFile(name, "java.txt").get(), StandardCharsets.UTF_8));
        cause(OpenShellException.NotFound.class, () -> client.readFile(name, "missing.txt").get());

        // A pty of 80x24, resized to 100x30 before the program reads its size again.
        ExecSpec spec =
            ExecSpec.builder(name, "sh", "-c", "stty size; read l; stty size").tty(80, 24).build();
        try (AsyncExecProcess process = client.execInteractive(spec).get()) {
          StringBuilder out = new StringBuilder();
          ExecEvent event = process.next().get(30, TimeUnit.SECONDS);
          while (event != null && !out.toString().contains("24 80")) {
            if (event instanceof ExecEvent.Stdout s) {
              out.append(new String(s.getData(), StandardCharsets.UTF_8));
            }
            if (!out.toString().contains("24 80")) {
              event = process.next().get(30, TimeUnit.SECONDS);
            }
          }
          process.resize(100, 30).get();
          process.write("\n".getBytes(StandardCharsets.UTF_8)).get();
          for (event = process.next().get(30, TimeUnit.SECONDS);
              event != null;
              event = process.next().get(30, TimeUnit.SECONDS)) {
            if (event instanceof ExecEvent.Stdout s) {
              out.append(new String(s.getData(), StandardCharsets.UTF_8));
            }
          }
          assertTrue(out.toString().contains("30 100"), out.toString());
        }

        SandboxLogs logs = client.logs(name, LogFilter.builder().tail(5).build()).get();
        assertTrue(logs.getLines().size() <= 5);
        cause(
            OpenShellException.InvalidArgument.class,
            () -> client.logs(name, LogFilter.builder().minLevel("LOUD").build()).get());

        try (AsyncSandboxWatch watch = client.watch(name).get()) {
          WatchEvent first = watch.next().get(20, TimeUnit.SECONDS);
          assertInstanceOf(WatchEvent.Sandbox.class, first);
          assertEquals(((WatchEvent.Sandbox) first).getCursor(), watch.getCursor());
        }

        cause(OpenShellException.NotFound.class, () -> client.forward(name + "-missing", 80).get());
        try (Forward forward = client.forwardSsh(name).get()) {
          assertTrue(forward.getLocalPort() > 0);
          assertEquals(0L, forward.stats().getConnectionsAccepted());
        }

        SshSession session = client.createSshSession(name).get();
        assertTrue(!session.toString().contains(session.getToken()));
        assertTrue(client.revokeSshSession(session.getToken()).get());
      } finally {
        client.deleteSandbox(name).get();
      }
    }
  }
}
