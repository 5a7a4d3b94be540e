//! Policy hashes and the fingerprints that tell identical updates apart.

use super::*;

/// SHA-256 (hex) of a normalised policy (version excluded).
pub fn policy_hash(policy: &SandboxPolicy) -> String {
    let mut unversioned = policy.clone();
    unversioned.version = 0;
    let mut hasher = Sha256::new();
    hasher.update(b"openshell.policy.v1\0");
    hasher.update(unversioned.encode_to_vec());
    hex::encode(hasher.finalize())
}

pub(super) fn put(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// Identifies the content of an update (both parts). Covers secrets: keep
/// it in memory.
pub fn fingerprint(
    config: &GetSandboxConfigResponse,
    env: &GetSandboxProviderEnvironmentResponse,
) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"openshell.config-update.v1\0");
    // The configuration's maps are ordered (BTreeMap): its encoding is stable.
    put(&mut hasher, &config.encode_to_vec());
    let mut entries: Vec<(&String, &String)> = env.environment.iter().collect();
    entries.sort();
    hasher.update((entries.len() as u64).to_be_bytes());
    for (key, value) in entries {
        put(&mut hasher, key.as_bytes());
        put(&mut hasher, value.as_bytes());
    }
    hasher.update(env.provider_env_revision.to_be_bytes());
    put(&mut hasher, env.provider_attachment_epoch.as_bytes());
    put(&mut hasher, env.policy_hash.as_bytes());
    hasher.finalize().into()
}
