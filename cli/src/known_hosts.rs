//! The known_hosts file `openshell ssh` manages
//! (`$XDG_CONFIG_HOME/openshell/known_hosts`, mode 0600): one alias per
//! sandbox (`openshell-<sandbox id>`, so a new sandbox of an old name never
//! meets the old key), with the host keys whose OpenSSH fingerprint
//! (`SHA256:<base64 of the key blob's SHA-256, unpadded>`) the gateway
//! vouched for.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::failure::{Failure, io};

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode(data: &[u8], pad: bool) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..4 {
            if i < chars {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else if pad {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes() {
        let v = ALPHABET.iter().position(|&a| a == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// The OpenSSH SHA256 fingerprint of a base64 key blob.
pub fn fingerprint(blob_b64: &str) -> Option<String> {
    let blob = b64_decode(blob_b64)?;
    Some(format!(
        "SHA256:{}",
        b64_encode(&Sha256::digest(&blob), false)
    ))
}

/// `SHA256:` and 43 unpadded base64 characters: the only form accepted
/// from the gateway.
pub fn valid_fingerprint(fp: &str) -> bool {
    fp.strip_prefix("SHA256:").is_some_and(|rest| {
        rest.len() == 43
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
    })
}

/// A host key line: `(key type, base64 blob)`.
pub type HostKey = (String, String);

/// The keys recorded for `alias`.
pub fn keys_for(path: &Path, alias: &str) -> Result<Vec<HostKey>, Failure> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(io(&format!("reading {}", path.display()), &err)),
    };
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let host = words.next()?;
            (host == alias).then_some(())?;
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect())
}

/// Whether a recorded key of `alias` has fingerprint `fp`.
pub fn pinned(path: &Path, alias: &str, fp: &str) -> Result<bool, Failure> {
    Ok(keys_for(path, alias)?
        .iter()
        .any(|(_, blob)| fingerprint(blob).as_deref() == Some(fp)))
}

/// Replaces the keys of `alias` with `keys` (other aliases kept), writing a
/// new file (0600) and renaming it over the old one.
pub fn replace(path: &Path, alias: &str, keys: &[HostKey]) -> Result<(), Failure> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| io(&format!("creating {}", dir.display()), &e))?;
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut text: String = old
        .lines()
        .filter(|line| line.split_whitespace().next() != Some(alias))
        .map(|line| format!("{line}\n"))
        .collect();
    for (kind, blob) in keys {
        text.push_str(&format!("{alias} {kind} {blob}\n"));
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(&format!("writing {}", path.display()), &e)
    })
}

/// Keys from `ssh-keyscan` output whose fingerprint is `fp`.
pub fn matching_scanned(scan: &str, fp: &str) -> Vec<HostKey> {
    scan.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let _host = words.next()?;
            let kind = words.next()?;
            let blob = words.next()?;
            (fingerprint(blob).as_deref() == Some(fp)).then(|| (kind.to_owned(), blob.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for data in [&b""[..], b"f", b"fo", b"foo", b"foob", b"fooba", b"foobar"] {
            let enc = b64_encode(data, true);
            assert_eq!(b64_decode(&enc).unwrap(), data);
        }
        assert_eq!(b64_encode(b"foobar", true), "Zm9vYmFy");
        assert_eq!(b64_encode(b"fo", true), "Zm8=");
        assert_eq!(b64_encode(b"fo", false), "Zm8");
        assert!(b64_decode("a*b").is_none());
    }

    #[test]
    fn fingerprints_match_ssh_keygen() {
        // A fresh key, fingerprinted by OpenSSH itself.
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k");
        let made = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .status()
            .expect("ssh-keygen (openssh-client; scripts/setup.sh installs it)");
        assert!(made.success());
        let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        let blob = public.split_whitespace().nth(1).unwrap();
        let listed = std::process::Command::new("ssh-keygen")
            .args(["-l", "-E", "sha256", "-f"])
            .arg(key.with_extension("pub"))
            .output()
            .unwrap();
        let listed = String::from_utf8(listed.stdout).unwrap();
        let theirs = listed.split_whitespace().nth(1).unwrap();
        let ours = fingerprint(blob).unwrap();
        assert_eq!(ours, theirs);
        assert!(valid_fingerprint(&ours), "{ours}");
        assert!(!valid_fingerprint("MD5:aa"));
        assert!(!valid_fingerprint("SHA256:has space and ; rm -rf"));
    }

    #[test]
    fn replace_keeps_other_aliases_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("known_hosts");
        let blob = "AAAAC3NzaC1lZDI1NTE5AAAAIGlgEfOi8SYnBYdCqaDLyz6pamvfxTDSk0sRRCVGF2Mz";
        let fp = fingerprint(blob).unwrap();
        replace(&path, "a", &[("ssh-ed25519".into(), blob.into())]).unwrap();
        replace(&path, "b", &[("ssh-ed25519".into(), blob.into())]).unwrap();
        replace(&path, "a", &[]).unwrap();
        assert!(!pinned(&path, "a", &fp).unwrap());
        assert!(pinned(&path, "b", &fp).unwrap());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let scan =
            format!("# comment\n[127.0.0.1]:2222 ssh-ed25519 {blob}\n127.0.0.1 ssh-rsa AAAAB3Nz\n");
        assert_eq!(matching_scanned(&scan, &fp).len(), 1);
    }
}
