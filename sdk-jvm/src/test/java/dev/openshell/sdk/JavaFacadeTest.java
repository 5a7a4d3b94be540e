package dev.openshell.sdk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.openshell.sdk.ffi.ExecEvent;
import dev.openshell.sdk.ffi.ExecOutput;
import dev.openshell.sdk.ffi.OpenShellException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import org.junit.jupiter.api.Test;

/** The Java facade: builders, CompletableFuture, AutoCloseable. */
class JavaFacadeTest {
  @Test
  void lifecycleExecAndErrorsFromJava() throws Exception {
    ClientConfig config =
        ClientConfig.builder(TestCluster.INSTANCE.getEndpoint())
            .defaultTimeout(Duration.ofSeconds(60))
            .build();
    try (OpenShellAsyncClient client = OpenShellAsyncClient.connect(config).get()) {
      String name = "jvm-java-" + UUID.randomUUID().toString().substring(0, 8);
      client.createSandbox(SandboxSpec.builder().name(name).label("suite", "jvm").build()).get();
      assertEquals("READY", client.waitReady(name).get().getPhase());
      try {
        ExecOutput out = client.exec(name, List.of("echo", "hello")).get();
        assertEquals("hello\n", new String(out.getStdout(), StandardCharsets.UTF_8));
        assertEquals(0, out.getExitCode());

        ExecOutput piped =
            client
                .exec(
                    ExecSpec.builder(name, "cat")
                        .stdin("from java".getBytes(StandardCharsets.UTF_8))
                        .build())
                .get();
        assertEquals("from java", new String(piped.getStdout(), StandardCharsets.UTF_8));

        try (AsyncExecProcess process =
            client.execInteractive(ExecSpec.builder(name, "cat").build()).get()) {
          process.write("echoed".getBytes(StandardCharsets.UTF_8)).get();
          process.closeStdin();
          StringBuilder stdout = new StringBuilder();
          int exit = -1;
          for (ExecEvent event = process.next().get();
              event != null;
              event = process.next().get()) {
            if (event instanceof ExecEvent.Stdout s) {
              stdout.append(new String(s.getData(), StandardCharsets.UTF_8));
            } else if (event instanceof ExecEvent.Exit e) {
              exit = e.getExitCode();
            }
          }
          assertEquals("echoed", stdout.toString());
          assertEquals(0, exit);
          assertNull(process.next().get());
        }
      } finally {
        assertTrue(List.of("COMPLETED", "ACCEPTED").contains(client.deleteSandbox(name).get()));
      }
      ExecutionException failed =
          assertThrows(ExecutionException.class, () -> client.getSandbox(name + "-missing").get());
      OpenShellException.NotFound notFound =
          assertInstanceOf(OpenShellException.NotFound.class, failed.getCause());
      assertEquals("not_found", notFound.getCode());
      assertEquals(5, notFound.getGrpcStatus());
    }
  }
}
