package dev.openshell.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.openshell.sdk.ffi.ExecOutput;
import dev.openshell.sdk.ffi.OpenShellException;
import dev.openshell.sdk.ffi.RoutingStats;
import dev.openshell.sdk.ffi.SandboxInfo;
import dev.openshell.sdk.ffi.SandboxWithOwner;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/**
 * The blocking client from Java against the shared 3-replica cluster: answers and exceptions on the
 * calling thread, owner routing, deadlines, close() from another thread.
 */
class JavaBlockingTest {
  private static ClientConfig config() {
    return ClientConfig.builder(TestCluster.INSTANCE.getEndpoint())
        .defaultTimeout(Duration.ofSeconds(60))
        .build();
  }

  private static String unique(String prefix) {
    return prefix + "-" + UUID.randomUUID().toString().substring(0, 8);
  }

  @Test
  void lifecycleExecAndRoutingOnTheCallingThread() throws Exception {
    try (OpenShellBlockingClient client = OpenShellBlockingClient.connect(config())) {
      assertEquals("HEALTHY", client.health().getStatus());
      String name = unique("jvm-blocking");
      String label = unique("run");
      client.createSandbox(SandboxSpec.builder().name(name).label("run", label).build());
      assertEquals("READY", client.waitReady(name).getPhase());
      try {
        ExecOutput out = client.exec(name, List.of("echo", "hello"));
        assertEquals("hello\n", new String(out.getStdout(), StandardCharsets.UTF_8));
        assertEquals(0, out.getExitCode());

        ExecOutput piped =
            client.exec(
                ExecSpec.builder(name, "sh", "-c", "cat; exit 3")
                    .stdin("from java".getBytes(StandardCharsets.UTF_8))
                    .build());
        assertEquals("from java", new String(piped.getStdout(), StandardCharsets.UTF_8));
        assertEquals(3, piped.getExitCode());

        SandboxWithOwner owned = client.getSandboxWithOwner(name);
        assertEquals(name, owned.getSandbox().getName());
        assertTrue(owned.getOwner() != null && !owned.getOwner().isEmpty(), "a 3-replica owner");
        RoutingStats stats = client.routingStats();
        assertTrue(stats.getHinted() >= 1, "execs went out hinted: " + stats);

        List<SandboxInfo> listed = client.listSandboxes("run=" + label);
        assertEquals(1, listed.size());
        assertEquals(name, listed.get(0).getName());
      } finally {
        assertTrue(List.of("COMPLETED", "ACCEPTED").contains(client.deleteSandbox(name)));
      }
      client.waitDeleted(name, Duration.ofSeconds(60));
      OpenShellException.NotFound gone =
          assertThrows(OpenShellException.NotFound.class, () -> client.getSandbox(name));
      assertEquals(5, gone.getGrpcStatus());
      assertThrows(OpenShellException.NotFound.class, () -> client.deleteSandbox(name));
    }
  }

  @Test
  void badInputDeadlinesAndCloseEndBlockedCalls() throws Exception {
    OpenShellBlockingClient client = OpenShellBlockingClient.connect(config());
    String name = unique("jvm-blocking-end");
    client.createSandbox(SandboxSpec.builder().name(name).build());
    client.waitReady(name);
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try {
      // Refused by the client before anything is sent, then by the gateway.
      assertThrows(OpenShellException.InvalidConfig.class, () -> client.exec(name, List.of()));
      // Arguments cross as UTF-8; the gateway refuses the name and its detail names it.
      String accented = "n\u00e4m\u00e9-" + name;
      OpenShellException.InvalidArgument missing =
          assertThrows(OpenShellException.InvalidArgument.class, () -> client.getSandbox(accented));
      assertTrue(missing.getMessage().contains(accented), "got " + missing.getMessage());
      assertThrows(
          OpenShellException.InvalidArgument.class,
          () -> client.createSandbox(SandboxSpec.builder().name("Not A Name!").build()));
      assertThrows(
          OpenShellException.DeadlineExceeded.class,
          () -> client.exec(ExecSpec.builder(name, "sleep", "30").build(), Duration.ofMillis(300)));

      // A call blocked in another thread ends with Cancelled when the client closes.
      Future<ExecOutput> blocked = pool.submit(() -> client.exec(name, List.of("sleep", "30")));
      Thread.sleep(500);
      assertFalse(blocked.isDone());
      long closing = System.nanoTime();
      client.close();
      Throwable cause =
          assertThrows(
                  java.util.concurrent.ExecutionException.class,
                  () -> blocked.get(10, TimeUnit.SECONDS))
              .getCause();
      assertTrue(cause instanceof OpenShellException.Cancelled, "got " + cause);
      assertTrue(System.nanoTime() - closing < TimeUnit.SECONDS.toNanos(5), "ended promptly");
      // A closed client is gone: later calls fail at once.
      assertThrows(IllegalStateException.class, () -> client.getSandbox(name));
    } finally {
      pool.shutdownNow();
      try (OpenShellBlockingClient cleanup = OpenShellBlockingClient.connect(config())) {
        cleanup.deleteSandbox(name);
      }
    }
  }

  private static String stdout(ExecOutput out) {
    return new String(out.getStdout(), StandardCharsets.UTF_8);
  }

  @Test
  void anInterruptCancelsTheBlockedCallAndKeepsTheFlag() throws Exception {
    try (OpenShellBlockingClient client = OpenShellBlockingClient.connect(config())) {
      String name = unique("jvm-blocking-interrupt");
      client.createSandbox(SandboxSpec.builder().name(name).build());
      client.waitReady(name);
      try {
        // A thread blocked in an exec is interrupted: the exec ends Cancelled, promptly.
        AtomicReference<Throwable> thrown = new AtomicReference<>();
        AtomicBoolean flagKept = new AtomicBoolean();
        Thread caller =
            new Thread(
                () -> {
                  try {
                    client.exec(name, List.of("sh", "-c", "echo started >> runs; exec sleep 30"));
                  } catch (Throwable t) {
                    thrown.set(t);
                  }
                  flagKept.set(Thread.currentThread().isInterrupted());
                });
        caller.start();
        String runs = "";
        for (int i = 0; i < 100 && !runs.contains("started"); i++) {
          Thread.sleep(100);
          runs = stdout(client.exec(name, List.of("sh", "-c", "cat runs 2>/dev/null || true")));
        }
        assertEquals("started\n", runs, "the exec began");
        long interrupting = System.nanoTime();
        caller.interrupt();
        caller.join(10_000);
        assertFalse(caller.isAlive(), "the interrupted call returned");
        assertTrue(System.nanoTime() - interrupting < TimeUnit.SECONDS.toNanos(5), "promptly");
        assertTrue(thrown.get() instanceof OpenShellException.Cancelled, "got " + thrown.get());
        assertTrue(flagKept.get(), "the thread is still marked interrupted");
        // The gateway killed the command with its RPC.
        String left = "";
        for (int i = 0; i < 50; i++) {
          left = stdout(client.exec(name, List.of("sh", "-c", "pgrep -f 'slee[p] 30' || true")));
          if (left.isEmpty()) {
            break;
          }
          Thread.sleep(100);
        }
        assertEquals("", left, "the command's process is gone");

        // A thread already interrupted: the call ends Cancelled before it is sent.
        Thread.currentThread().interrupt();
        try {
          assertThrows(
              OpenShellException.Cancelled.class,
              () -> client.exec(name, List.of("sh", "-c", "echo again >> runs")));
          assertTrue(Thread.currentThread().isInterrupted());
        } finally {
          Thread.interrupted();
        }
        assertEquals("started\n", stdout(client.exec(name, List.of("cat", "runs"))));

        // Future.cancel(true) interrupts the pool thread: the same path.
        ExecutorService pool = Executors.newSingleThreadExecutor();
        try {
          Future<ExecOutput> blocked = pool.submit(() -> client.exec(name, List.of("sleep", "30")));
          Thread.sleep(300);
          blocked.cancel(true);
          // The pool thread is free again within seconds, not after 30.
          Future<String> next = pool.submit(() -> client.getSandbox(name).getName());
          assertEquals(name, next.get(10, TimeUnit.SECONDS));
        } finally {
          pool.shutdownNow();
        }
      } finally {
        client.deleteSandbox(name);
      }
    }
  }

  @Test
  void manyThreadsShareOneClient() throws Exception {
    try (OpenShellBlockingClient client = OpenShellBlockingClient.connect(config())) {
      String name = unique("jvm-blocking-threads");
      client.createSandbox(SandboxSpec.builder().name(name).build());
      client.waitReady(name);
      ExecutorService pool = Executors.newFixedThreadPool(16);
      try {
        List<Future<Integer>> calls = new ArrayList<>();
        for (int t = 0; t < 16; t++) {
          calls.add(
              pool.submit(
                  () -> {
                    int got = 0;
                    for (int i = 0; i < 25; i++) {
                      if (client.getSandbox(name).getName().equals(name)) {
                        got++;
                      }
                    }
                    return got;
                  }));
        }
        int total = 0;
        for (Future<Integer> call : calls) {
          total += call.get(60, TimeUnit.SECONDS);
        }
        assertEquals(16 * 25, total);
      } finally {
        pool.shutdownNow();
        client.deleteSandbox(name);
      }
    }
  }
}
