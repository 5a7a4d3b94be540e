//! What the examples share: a sandbox to work in.
//!
//! Given a sandbox name on the command line, an example uses that sandbox.
//! Without one it creates a sandbox of its own (labelled `example=<name>`;
//! the image from `OPENSHELL_IMAGE` if set), waits until it is READY, and
//! deletes it again at the end, so every example runs on a fresh
//! `openshell-gateway up` (or `make up`) cluster with nothing created first.
//! (Not an example itself: Cargo only builds `examples/*.rs`.)

#![allow(dead_code)]

use std::time::Duration;

use openshell_sdk::{CallOptions, Client, CreateSandbox, Error};

/// A sandbox an example runs in.
pub struct ExampleSandbox {
    pub name: String,
    /// Created by the example, so deleted by [`ExampleSandbox::finish`].
    created: bool,
}

/// Uses `name`, or creates a sandbox for `example` and waits until it is READY.
pub async fn sandbox(
    client: &Client,
    example: &str,
    name: Option<String>,
) -> Result<ExampleSandbox, Error> {
    if let Some(name) = name {
        return Ok(ExampleSandbox {
            name,
            created: false,
        });
    }
    let created = create(client, example).await?;
    client
        .sandboxes()
        .wait_ready(
            &created.name,
            CallOptions::new().deadline(Duration::from_secs(120)),
        )
        .await?;
    println!("[sandbox {} is ready]", created.name);
    Ok(created)
}

/// Creates a sandbox for `example` without waiting for it.
pub async fn create(client: &Client, example: &str) -> Result<ExampleSandbox, Error> {
    let mut request = CreateSandbox::new().label("example", example);
    if let Ok(image) = std::env::var("OPENSHELL_IMAGE") {
        request = request.image(image);
    }
    let sandbox = client
        .sandboxes()
        .create(request, CallOptions::new())
        .await?;
    println!("[created sandbox {}]", sandbox.name);
    Ok(ExampleSandbox {
        name: sandbox.name,
        created: true,
    })
}

impl ExampleSandbox {
    /// Whether the example created this sandbox (and so deletes it).
    pub fn created(&self) -> bool {
        self.created
    }

    /// Deletes the sandbox if the example created it, and waits until it is gone.
    pub async fn finish(self, client: &Client) -> Result<(), Error> {
        if !self.created {
            return Ok(());
        }
        let sandboxes = client.sandboxes();
        sandboxes.delete(&self.name, CallOptions::new()).await?;
        sandboxes
            .wait_deleted(
                &self.name,
                CallOptions::new().deadline(Duration::from_secs(60)),
            )
            .await?;
        println!("[deleted sandbox {}]", self.name);
        Ok(())
    }
}
