//! Request and response metadata as plain string pairs.
//!
//! This is the form metadata takes at the binding boundary: ordered
//! `(key, value)` pairs of strings. Keys are lowercase ASCII. Values of
//! binary keys (ending in `-bin`) are the base64 text as it travels on the
//! wire. `Debug` redacts values of keys that carry credentials.

use std::fmt;

use http::{HeaderName, HeaderValue};
use tonic::metadata::MetadataMap;

/// Response metadata key naming the gateway replica that produced an answer.
pub const SERVED_BY: &str = "x-openshell-served-by";
/// Request metadata key asking `GetSandbox` for the owner replica.
pub const WANT_OWNER: &str = "x-openshell-want-owner";
/// Response metadata key naming the owner replica of a sandbox.
pub const OWNER: &str = "x-openshell-owner";
/// Request metadata key with the replica hint for owner-routed streams.
pub const REPLICA: &str = "x-openshell-replica";

/// Ordered metadata pairs.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Metadata(Vec<(String, String)>);

impl Metadata {
    /// Empty metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a pair (keys may repeat).
    pub fn append(&mut self, key: impl Into<String>, value: impl Into<String>) {
        let mut key = key.into();
        key.make_ascii_lowercase();
        self.0.push((key, value.into()));
    }

    /// Builder form of [`Metadata::append`].
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.append(key, value);
        self
    }

    /// First value of `key` (case-insensitive).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    /// All pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs, consuming the metadata.
    pub fn into_vec(self) -> Vec<(String, String)> {
        self.0
    }

    /// Copies tonic metadata; values that are not visible ASCII are skipped.
    pub(crate) fn from_tonic(map: &MetadataMap) -> Self {
        Self::from_headers(&map.clone().into_headers())
    }

    /// [`Metadata::from_tonic`] of metadata the caller owns (no copy of the map).
    pub(crate) fn from_tonic_owned(map: MetadataMap) -> Self {
        Self::from_headers(&map.into_headers())
    }

    pub(crate) fn from_headers(headers: &http::HeaderMap) -> Self {
        let mut out = Metadata(Vec::with_capacity(headers.len()));
        for (name, value) in headers {
            if let Ok(v) = value.to_str() {
                // Header names are lowercase already.
                out.0.push((name.as_str().to_owned(), v.to_owned()));
            }
        }
        out
    }

    /// Writes the pairs into `headers`. Fails on a key or value that is not
    /// valid metadata (the error names the key only; it becomes
    /// `invalid_config`).
    pub(crate) fn write_to(&self, headers: &mut http::HeaderMap) -> Result<(), InvalidMetadata> {
        for (key, value) in &self.0 {
            let name = HeaderName::from_bytes(key.as_bytes()).map_err(|_| {
                InvalidMetadata(format!("metadata key {key:?} is not a valid header name"))
            })?;
            let mut value = HeaderValue::from_str(value).map_err(|_| {
                InvalidMetadata(format!("metadata value of {key:?} is not valid ASCII"))
            })?;
            if is_sensitive(key) {
                value.set_sensitive(true);
            }
            headers.append(name, value);
        }
        Ok(())
    }
}

/// A pair that cannot travel as metadata. The message names the key, never
/// the value. [`Error`](crate::Error) turns it into `invalid_config`; this
/// module sits below `error` and so does not build errors itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidMetadata(pub(crate) String);

impl fmt::Display for InvalidMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidMetadata {}

impl From<Vec<(String, String)>> for Metadata {
    fn from(pairs: Vec<(String, String)>) -> Self {
        let mut out = Metadata::new();
        for (k, v) in pairs {
            out.append(k, v);
        }
        out
    }
}

impl<K: Into<String>, V: Into<String>, const N: usize> From<[(K, V); N]> for Metadata {
    fn from(pairs: [(K, V); N]) -> Self {
        let mut out = Metadata::new();
        for (k, v) in pairs {
            out.append(k, v);
        }
        out
    }
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, v)| {
                if is_sensitive(k) {
                    (k.as_str(), "<redacted>")
                } else {
                    (k.as_str(), v.as_str())
                }
            }))
            .finish()
    }
}

/// Keys whose values are credentials and must never be logged.
pub(crate) fn is_sensitive(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key == "authorization"
        || key == "cookie"
        || key == "set-cookie"
        || key.contains("token")
        || key.contains("secret")
        || key.contains("password")
        || key.contains("api-key")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_credentials() {
        let md = Metadata::from([
            ("authorization", "Bearer s3cr3t-value"),
            ("x-auth-token", "tok-123"),
            ("x-request-id", "abc"),
        ]);
        let text = format!("{md:?}");
        assert!(!text.contains("s3cr3t-value"), "{text}");
        assert!(!text.contains("tok-123"), "{text}");
        assert!(text.contains("abc"));
    }

    #[test]
    fn keys_are_lowercased_and_lookup_is_case_insensitive() {
        let md = Metadata::new().with("X-OpenShell-Served-By", "gw-0");
        assert_eq!(md.get(SERVED_BY), Some("gw-0"));
        assert_eq!(md.iter().next().unwrap().0, SERVED_BY);
    }

    #[test]
    fn invalid_metadata_is_invalid_config_without_the_value() {
        let mut headers = http::HeaderMap::new();
        let err = crate::Error::from(
            Metadata::new()
                .with("authorization", "Bearer bad\nvalue-secret")
                .write_to(&mut headers)
                .unwrap_err(),
        );
        assert_eq!(err.code(), "invalid_config");
        assert!(!err.to_string().contains("value-secret"));
        let err = crate::Error::from(
            Metadata::new()
                .with("bad key", "v")
                .write_to(&mut headers)
                .unwrap_err(),
        );
        assert_eq!(err.code(), "invalid_config");
    }

    #[test]
    fn round_trips_through_headers() {
        let mut headers = http::HeaderMap::new();
        Metadata::from(vec![("a".to_owned(), "1".to_owned())])
            .with("a", "2")
            .write_to(&mut headers)
            .unwrap();
        let back = Metadata::from_headers(&headers);
        assert_eq!(back.len(), 2);
        assert_eq!(back.get("a"), Some("1"));
    }
}
