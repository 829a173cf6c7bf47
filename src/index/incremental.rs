//! An index built from the previous one and the servers that changed: the others
//! keep their rows, their place in the one order and in the role maps, so a refresh
//! that read a few files examines only their servers.

use super::{place, rows_of, sort_name, unsettled_in, EnvironmentEntry, Index, Positions, Staged, GENERATION};
use crate::store::{Builder, KeyHint, StrId};
use hashbrown::{HashMap, HashSet};
use std::sync::atomic::Ordering;

/// A position of the previous index whose server is not in the new one.
const DROPPED: u32 = u32::MAX;

/// An item of a merge: from the kept ones, or from the fresh ones.
#[derive(Clone, Copy)]
enum Slot<K, F> {
    Kept(K),
    Fresh(F),
}

impl Index {
    /// Positions whose environment did not come from their facts alone; `None` when
    /// not known (stored rows): such an index is not gone on from.
    pub fn unsettled_environments(&self) -> Option<&[u32]> {
        self.unsettled.as_deref()
    }

    /// The index [`Index::from_staged`] would give for the servers of `previous`
    /// whose certname is not in `replaced`, and `staged`: every server of those
    /// certnames (duplicates included). `builder` goes on from `previous`'s store
    /// (every id of it valid), and `previous` was built for the same role fact;
    /// the caller vouches that the servers it keeps are unchanged.
    pub fn from_previous(
        previous: &Index,
        builder: Builder,
        replaced: &HashSet<StrId>,
        staged: Vec<Staged>,
        built_at: i64,
    ) -> Index {
        let store = builder.store();
        let old = &previous.rows;
        let (fresh, fresh_by_certname) = place(store, staged);
        let kept: Vec<u32> = (0..old.len() as u32).filter(|p| !replaced.contains(&old.certname[*p as usize])).collect();

        let (mut fqdn, mut fresh_fqdn) = (KeyHint::new("fqdn"), KeyHint::new("fqdn"));
        // Where each row of the new index comes from: a position of `previous`, or `fresh`.
        let order = merge(&kept, &fresh, |p, other| {
            let server = staged_at(previous, p);
            let key = (sort_name(store, &server, &mut fqdn), store.str(server.certname));
            key < (sort_name(store, &other, &mut fresh_fqdn), store.str(other.certname))
        });

        let unsettled = previous.unsettled.as_deref().unwrap_or(&[]);
        let placed: Vec<Staged> = order
            .iter()
            .map(|slot| match *slot {
                Slot::Kept(p) => {
                    Staged { environment_from_facts: unsettled.binary_search(&p).is_err(), ..staged_at(previous, p) }
                }
                Slot::Fresh(server) => server,
            })
            .collect();
        let (mut old_to_new, mut fresh_to_new) = (vec![DROPPED; old.len()], Vec::with_capacity(fresh.len()));
        for (position, slot) in order.iter().enumerate() {
            match *slot {
                Slot::Kept(p) => old_to_new[p as usize] = position as u32,
                Slot::Fresh(_) => fresh_to_new.push(position as u32),
            }
        }
        let remap = |positions: &[u32]| -> Positions {
            positions.iter().map(|p| old_to_new[*p as usize]).filter(|p| *p != DROPPED).collect()
        };

        // Certname order: the kept servers' as before, each fresh one put in its place.
        let by_certname = {
            let fresh_in_order: Vec<u32> = fresh_by_certname.iter().map(|i| fresh_to_new[*i as usize]).collect();
            let certname = |position: u32| store.str(placed[position as usize].certname);
            let merged = merge(&remap(&previous.by_certname), &fresh_in_order, |k, f| certname(k) < certname(f));
            merged.into_iter().map(|(Slot::Kept(p) | Slot::Fresh(p))| p).collect()
        };

        let mut by_environment: HashMap<String, EnvironmentEntry> = previous
            .by_environment
            .iter()
            .map(|(name, entry)| {
                let by_role = entry.by_role.iter().map(|(role, positions)| (role.clone(), remap(positions))).collect();
                (name.clone(), EnvironmentEntry { all: remap(&entry.all), by_role })
            })
            .collect();
        let mut role_hint = KeyHint::new(&previous.role_fact);
        for &position in &fresh_to_new {
            let server = &placed[position as usize];
            let entry = by_environment.entry_ref(store.str(server.environment)).or_default();
            insert_sorted(&mut entry.all, position);
            let facts = store.view(server.facts).as_object();
            let role = facts.and_then(|f| super::server::role_value(f, &previous.role_fact, &mut role_hint));
            for role in super::server::roles_in(role) {
                insert_sorted(entry.by_role.entry_ref(role).or_default(), position);
            }
        }
        // As a full build: no entry for an environment or a role without servers.
        by_environment.retain(|_, entry| {
            entry.by_role.retain(|_, positions| !positions.is_empty());
            !entry.all.is_empty()
        });

        let rows = rows_of(&placed);
        let unsettled = unsettled_in(&placed);
        drop(placed);
        Index {
            store: builder.finish(),
            rows,
            by_certname,
            by_environment,
            role_fact: previous.role_fact.clone(),
            paths: Default::default(),
            answers: Default::default(),
            built_at,
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            unsettled: Some(unsettled),
        }
    }
}

/// Row `p` of `index` as it was staged (its environment's origin aside).
fn staged_at(index: &Index, p: u32) -> Staged {
    let (rows, p) = (&index.rows, p as usize);
    Staged {
        certname: rows.certname[p],
        environment: rows.environment[p],
        facts: rows.facts[p],
        extra: rows.extra[p],
        timestamp: rows.timestamp[p],
        answered_at: rows.answered_at[p],
        environment_from_facts: false,
    }
}

/// `kept` and `fresh`, each in order, merged; `before(k, f)` says `k` goes first.
/// One binary search per fresh item: a few among many.
fn merge<K: Copy, F: Copy>(kept: &[K], fresh: &[F], mut before: impl FnMut(K, F) -> bool) -> Vec<Slot<K, F>> {
    let mut merged = Vec::with_capacity(kept.len() + fresh.len());
    let mut start = 0;
    for &item in fresh {
        let at = start + kept[start..].partition_point(|k| before(*k, item));
        merged.extend(kept[start..at].iter().map(|k| Slot::Kept(*k)));
        merged.push(Slot::Fresh(item));
        start = at;
    }
    merged.extend(kept[start..].iter().map(|k| Slot::Kept(*k)));
    merged
}

/// Adds `position` to ascending `positions` unless it is there.
fn insert_sorted(positions: &mut Positions, position: u32) {
    if let Err(at) = positions.binary_search(&position) {
        positions.insert(at, position);
    }
}
