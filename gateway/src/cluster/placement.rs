//! Where a supervisor host's session goes (PROTOCOL.md section 4): the ring
//! and a cap. With `hosts` seated hosts (the arriving one included) and
//! `replicas` live replicas that are not leaving, no replica should serve
//! more than `ceil(hosts / replicas)`. Walking the ring clockwise from the
//! host's own point (key = its member id), the first replica below that cap
//! gets it; when every replica is at the cap, the ring owner does. The ring
//! keeps placement stable (a host keeps landing on the same replicas); the
//! cap keeps it even.
//!
//! Pure functions: the store decides atomically what the counts are
//! (`Store::place_host`), these decide what they mean.

use std::collections::HashMap;

use crate::cluster::ring::Ring;
use crate::store::HostSeat;

/// `ceil(hosts / replicas)`; 0 replicas have no cap.
pub fn cap(hosts: usize, replicas: usize) -> usize {
    if replicas == 0 {
        return usize::MAX;
    }
    hosts.div_ceil(replicas)
}

/// Hosts per replica on `ring`: seats of the arriving host and seats on
/// replicas off the ring (leaving or gone) do not count.
pub fn counts(seats: &[HostSeat], arriving: &str, ring: &Ring) -> HashMap<String, usize> {
    let members = ring.members();
    let mut counts = HashMap::new();
    for seat in seats {
        if seat.host_id != arriving && members.contains(&seat.replica_id) {
            *counts.entry(seat.replica_id.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// The first replica clockwise from `start_key`'s point serving fewer than
/// `cap` hosts; when none does, the ring owner of `start_key`. `None` only
/// for an empty ring.
pub fn first_below<'a>(
    ring: &'a Ring,
    start_key: &str,
    counts: &HashMap<String, usize>,
    cap: usize,
) -> Option<&'a str> {
    let walk = ring.walk(start_key);
    walk.iter()
        .find(|replica| counts.get(**replica).copied().unwrap_or(0) < cap)
        .or_else(|| walk.first())
        .copied()
}

/// The replica host `host_id` should be seated on, given the other hosts'
/// seats: the cap counts every seated host but its own, plus itself.
pub fn place(ring: &Ring, host_id: &str, seats: &[HostSeat]) -> Option<String> {
    let others = seats.iter().filter(|s| s.host_id != host_id).count();
    let cap = cap(others + 1, ring.members().len());
    let counts = counts(seats, host_id, ring);
    first_below(ring, host_id, &counts, cap).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat(host: &str, replica: &str) -> HostSeat {
        HostSeat {
            host_id: host.into(),
            replica_id: replica.into(),
        }
    }

    fn ring3() -> Ring {
        Ring::new(["gw-0", "gw-1", "gw-2"])
    }

    #[test]
    fn cap_is_the_ceiling() {
        assert_eq!(cap(7, 3), 3);
        assert_eq!(cap(6, 3), 2);
        assert_eq!(cap(1, 3), 1);
        assert_eq!(cap(0, 3), 0);
        assert_eq!(cap(5, 0), usize::MAX);
    }

    #[test]
    fn first_below_skips_full_replicas() {
        let ring = ring3();
        let walk = ring.walk("h-0");
        assert_eq!(walk.len(), 3);
        let mut counts = HashMap::new();
        counts.insert(walk[0].to_owned(), 2);
        // The owner is full: the next replica clockwise takes it.
        assert_eq!(first_below(&ring, "h-0", &counts, 2), Some(walk[1]));
        counts.insert(walk[1].to_owned(), 2);
        assert_eq!(first_below(&ring, "h-0", &counts, 2), Some(walk[2]));
        // Below the cap, the owner itself.
        assert_eq!(first_below(&ring, "h-0", &counts, 3), Some(walk[0]));
    }

    #[test]
    fn first_below_falls_back_to_the_owner() {
        let ring = ring3();
        let counts: HashMap<String, usize> = ring.members().into_iter().map(|r| (r, 2)).collect();
        assert_eq!(
            first_below(&ring, "h-9", &counts, 2),
            ring.owner("h-9"),
            "every replica at the cap: the ring owner"
        );
        assert_eq!(first_below(&Ring::default(), "h-9", &counts, 2), None);
    }

    #[test]
    fn arrivals_fill_every_replica_evenly() {
        let ring = ring3();
        for hosts in [3usize, 7, 9, 20] {
            let mut seats = Vec::new();
            for i in 0..hosts {
                let id = format!("h-{i}");
                let target = place(&ring, &id, &seats).unwrap();
                seats.push(seat(&id, &target));
            }
            let counts = counts(&seats, "", &ring);
            let most = counts.values().max().copied().unwrap_or(0);
            let least = ring
                .members()
                .iter()
                .map(|r| counts.get(r).copied().unwrap_or(0))
                .min()
                .unwrap();
            assert!(most <= cap(hosts, 3), "{hosts} hosts: {counts:?}");
            assert!(most - least <= 1, "{hosts} hosts: {counts:?}");
        }
    }

    #[test]
    fn the_hosts_own_record_is_ignored() {
        let ring = Ring::new(["gw-0", "gw-1"]);
        let owner = ring.owner("h-0").unwrap().to_owned();
        let other = ring.members().into_iter().find(|r| *r != owner).unwrap();
        // h-0's own stale seat on its owner does not make the owner look
        // full: with h-1 on the other replica, h-0 goes home.
        let seats = vec![seat("h-0", &owner), seat("h-1", &other)];
        assert_eq!(place(&ring, "h-0", &seats), Some(owner.clone()));
        // Counted, it would have (cap 1, owner at 1) pushed h-0 away.
        let counted = counts(&seats, "someone-else", &ring);
        assert_eq!(counted.get(&owner), Some(&1));
    }

    #[test]
    fn leaving_replicas_are_ignored() {
        let full = ring3();
        let ring = full.without("gw-2");
        // Hosts seated on the leaving gw-2 count towards the cap but not
        // towards any replica, and gw-2 is never chosen.
        let seats = vec![
            seat("h-a", "gw-2"),
            seat("h-b", "gw-2"),
            seat("h-c", "gw-2"),
        ];
        let counts = counts(&seats, "h-0", &ring);
        assert!(counts.is_empty(), "{counts:?}");
        for i in 0..20 {
            let target = place(&ring, &format!("h-{i}"), &seats).unwrap();
            assert_ne!(target, "gw-2");
        }
    }

    #[test]
    fn a_handoff_counts_the_hosts_already_handed_off() {
        // gw-2 stops with four hosts; the others serve one each. Handing
        // them off one at a time, each seated before the next is placed,
        // ends with three per replica at most.
        let ring = ring3().without("gw-2");
        let mut seats = vec![seat("x-0", "gw-0"), seat("x-1", "gw-1")];
        for i in 0..4 {
            seats.push(seat(&format!("h-{i}"), "gw-2"));
        }
        for i in 0..4 {
            let id = format!("h-{i}");
            let target = place(&ring, &id, &seats).unwrap();
            seats.retain(|s| s.host_id != id);
            seats.push(seat(&id, &target));
        }
        let counts = counts(&seats, "", &ring);
        assert_eq!(counts.get("gw-0"), Some(&3), "{counts:?}");
        assert_eq!(counts.get("gw-1"), Some(&3), "{counts:?}");
    }
}
