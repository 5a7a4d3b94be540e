//! `openshell-gateway host-token`: issues the token of a shared supervisor
//! host. Creates the host's record (or gives an existing host a new token,
//! which ends the old one's use) in the store the replicas use, and writes
//! the token to a file of mode 0600 for the host to read
//! (`openshell-supervisor host --token-file`). The store keeps only the
//! token's SHA-256; nothing secret is printed.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;

use crate::secret::Secret;
use crate::store::{Store, StoreOptions};

#[derive(Args, Debug)]
pub struct HostTokenArgs {
    /// The data directory of the replicas (their embedded SQLite store).
    #[arg(
        long,
        conflicts_with = "database_url",
        required_unless_present = "database_url"
    )]
    data_dir: Option<PathBuf>,
    /// The replicas' store URL (`postgres://...` or `sqlite://PATH`).
    #[arg(long, env = "OPENSHELL_DATABASE_URL", hide_env_values = true)]
    database_url: Option<Secret>,
    /// The host's id: what its hello names as `member_id`.
    #[arg(long)]
    host_id: String,
    /// Where to write the token (created or replaced, mode 0600).
    #[arg(long)]
    out: PathBuf,
}

/// Longest host id.
pub const MAX_HOST_ID: usize = 128;

/// A host id is 1 to 128 ASCII letters, digits, `.`, `_` or `-`.
pub fn check_host_id(id: &str) -> anyhow::Result<()> {
    if id.is_empty() || id.len() > MAX_HOST_ID {
        bail!("--host-id must be 1 to {MAX_HOST_ID} characters");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        bail!("--host-id may only hold ASCII letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

pub async fn run(args: HostTokenArgs) -> anyhow::Result<()> {
    check_host_id(&args.host_id)?;
    let url = match (&args.database_url, &args.data_dir) {
        (Some(url), _) => url.expose().to_owned(),
        (None, Some(dir)) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating data directory {}", dir.display()))?;
            let path = crate::store::layout::prepare(&dir.canonicalize()?)
                .context("preparing the data directory")?;
            format!("sqlite://{}", path.display())
        }
        (None, None) => bail!("pass --data-dir or --database-url"),
    };
    let store = Store::open(&url, StoreOptions::default())
        .await
        .map_err(|err| anyhow::anyhow!("opening the store: {err}"))?;
    let result = issue(&store, &args.host_id, &args.out).await;
    store.close().await;
    result?;
    println!(
        "host {}: token written to {} (mode 0600)",
        args.host_id,
        args.out.display()
    );
    Ok(())
}

/// Makes a new token for `host_id`, stores its hash and writes it to `out`.
/// The file is written first: a store that refuses leaves the old token in
/// force and a file nobody accepts, never a stored token nobody has.
pub async fn issue(store: &Store, host_id: &str, out: &Path) -> anyhow::Result<()> {
    check_host_id(host_id)?;
    let (token, hash) = crate::auth::new_host_token();
    write_private(out, &token).with_context(|| format!("writing {}", out.display()))?;
    store
        .set_host_token(host_id, &hash)
        .await
        .map_err(|err| anyhow::anyhow!("storing the host token: {err}"))?;
    Ok(())
}

fn write_private(path: &Path, token: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its mode on open: narrow it.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(token.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids() {
        assert!(check_host_id("h-0").is_ok());
        assert!(check_host_id("pool.a_1").is_ok());
        assert!(check_host_id("").is_err());
        assert!(check_host_id("h 0").is_err());
        assert!(check_host_id("h/0").is_err());
        assert!(check_host_id(&"h".repeat(MAX_HOST_ID + 1)).is_err());
    }

    #[tokio::test]
    async fn the_store_keeps_the_hash_and_the_file_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("g.db").display());
        let store = Store::open(&url, StoreOptions::default()).await.unwrap();
        let out = dir.path().join("h-0.token");
        std::fs::write(&out, "old").unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
        issue(&store, "h-0", &out).await.unwrap();
        let token = std::fs::read_to_string(&out).unwrap().trim().to_owned();
        assert!(token.starts_with(crate::auth::HOST_TOKEN_PREFIX), "{token}");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let hash = hex::encode(crate::auth::sha256(token.as_bytes()));
        assert_eq!(
            store.host_for_token(&hash).await.unwrap().as_deref(),
            Some("h-0")
        );
        assert_eq!(store.host_for_token(&token).await.unwrap(), None);
        // Rotating: the old token stops working.
        issue(&store, "h-0", &out).await.unwrap();
        assert_eq!(store.host_for_token(&hash).await.unwrap(), None);
    }
}
