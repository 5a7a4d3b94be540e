package dev.openshell.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.openshell.sdk.ffi.DeliveryMode;
import dev.openshell.sdk.ffi.OpenShellException;
import java.time.Duration;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.Test;

/**
 * The Java facade of the config session: a lambda apply callback, CompletableFuture runs, pulled
 * updates.
 */
class JavaSessionTest {
  private static void until(String what, BooleanSupplier check) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
    while (!check.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("timed out waiting until " + what);
      }
      Thread.sleep(50);
    }
  }

  @Test
  void configSessionFromJava() throws Exception {
    try (ConfigGateway gateway = ConfigGateway.Companion.start("push", "none");
        OpenShellAsyncClient client =
            OpenShellAsyncClient.connect(
                    ClientConfig.builder(gateway.getEndpoint())
                        .defaultTimeout(Duration.ofSeconds(30))
                        .build())
                .get()) {
      String name = "jvm-java-cfg-" + UUID.randomUUID().toString().substring(0, 8);
      String id = client.createSandbox(SandboxSpec.builder().name(name).build()).get().getId();
      SessionConfig config =
          SessionConfig.builder(gateway.getEndpoint(), gateway.sandboxToken(id))
              .allowCleartextToken(true)
              .build();
      List<String> colors = new CopyOnWriteArrayList<>();
      try (AsyncConfigSession session =
          AsyncConfigSession.create(
              config,
              id,
              snapshot -> {
                String color = snapshot.stringSetting("color");
                if ("plaid".equals(color)) {
                  throw new ConfigRejected("no plaid");
                }
                colors.add(String.valueOf(color));
              })) {
        CompletableFuture<Void> run = session.run();
        until("push mode", () -> session.stats().getMode() == DeliveryMode.PUSH);
        client.setSetting(name, "color", "blue").get();
        until("color=blue applied", () -> colors.contains("blue"));
        client.setSetting(name, "color", "plaid").get();
        until("color=plaid rejected", () -> session.stats().getRejected() == 1L);
        ExecutionException refused =
            assertThrows(ExecutionException.class, () -> session.run().get(20, TimeUnit.SECONDS));
        assertInstanceOf(OpenShellException.FailedPrecondition.class, refused.getCause());
        assertNotNull(session.stats().getServedBy());
        session.stop();
        run.get(15, TimeUnit.SECONDS);
        assertTrue(run.isDone());
      }

      try (AsyncConfigSession session = AsyncConfigSession.withUpdates(config, id)) {
        CompletableFuture<Void> run = session.run();
        ConfigUpdate first = session.nextUpdate().get(20, TimeUnit.SECONDS);
        assertNotNull(first);
        assertTrue(first.ack());
        client.setSetting(name, "color", "green").get();
        ConfigUpdate next = session.nextUpdate().get(20, TimeUnit.SECONDS);
        assertEquals("green", next.getSnapshot().stringSetting("color"));
        assertTrue(next.reject("not green either"));
        until("green rejected", () -> session.stats().getRejected() == 1L);
        session.stop();
        run.get(15, TimeUnit.SECONDS);
      }
    }
  }
}
