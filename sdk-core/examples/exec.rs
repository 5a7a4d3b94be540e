//! Buffered exec: run a command, get stdout, stderr and the exit code.
//!
//! Output is collected inside the core up to a cap; past it the call is
//! cancelled and fails with code `output_limit`.
//!
//! ```sh
//! # In a sandbox of its own (created, then deleted):
//! cargo run -p openshell-sdk --example exec
//! # In an existing sandbox, with a command:
//! cargo run -p openshell-sdk --example exec -- my-sandbox uname -a
//! ```

mod support;

use std::time::Duration;

use openshell_sdk::{CallOptions, Client, ClientConfig, Error, ExecRequest};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let name = args.next();
    let mut command: Vec<String> = args.collect();
    if command.is_empty() {
        command = vec!["echo".into(), "hello from the sandbox".into()];
    }
    let client = Client::connect(ClientConfig::from_env().build()?).await?;
    let sandbox = support::sandbox(&client, "exec", name).await?;

    let request = ExecRequest::new(&sandbox.name, command)
        .env("EXAMPLE", "1")
        .timeout(Duration::from_secs(60)) // server-side: exit code 124 when it expires
        .output_limit(8 * 1024 * 1024); // this call only; the client default is 64 MiB
    let result = match client.exec(request, CallOptions::new()).await {
        Ok(output) => {
            print!("{}", output.stdout_text());
            eprint!("{}", output.stderr_text());
            println!("exit code {}", output.exit_code);
            Ok(())
        }
        Err(err) if err.code() == "output_limit" => {
            eprintln!("too much output: {err}");
            Err(err)
        }
        Err(err) => Err(err),
    };
    sandbox.finish(&client).await?;
    result
}
