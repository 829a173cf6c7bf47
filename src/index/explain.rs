//! What `puppet kicker explain` reads of the index: a server's part in a query, from
//! the very tables [`Index::with_facts`] and [`Index::with_role`] answer from.

use super::path::Found;
use super::{Freshness, Index, RoleSelector};
use crate::query::Clause;
use crate::store::View;

/// What a server has at a clause's path, as the path's index holds it.
#[derive(Clone, Copy, Debug)]
pub enum AtPath<'a> {
    /// No fact there: no clause matches, `!=` included.
    Missing,
    Value(View<'a>),
    /// Text tested as such: the server's environment (a clause on `environment`),
    /// or its certname (a clause on `certname` where no fact has that name).
    Text(&'a str),
}

/// Any age admitted: a role's verdict apart from `max_age`.
const ANY_AGE: Freshness = Freshness { now: 0, max_age: i64::MAX as u64 };

impl Index {
    /// What server `position` has at `clause`'s path and whether the clause holds
    /// there: the path index's entry and bit that [`Index::with_facts`] reads.
    pub fn clause_at(&self, clause: &Clause, position: u32) -> (AtPath<'_>, bool) {
        let test = self.paths.test(self, clause);
        let found = match test.found(position) {
            Found::Missing => AtPath::Missing,
            Found::Value(id) => AtPath::Value(self.store.view(id)),
            Found::Text(id) => AtPath::Text(self.store.str(id)),
        };
        (found, test.holds(position))
    }

    /// Whether [`Index::with_role`] selects server `position` for `roles` in its own
    /// environment, whatever its age.
    pub fn has_role(&self, roles: &RoleSelector, position: u32) -> bool {
        let environment = self.server(position).environment();
        self.with_role(roles, environment, ANY_AGE).binary_search(&position).is_ok()
    }

    /// Certnames of the index, in certname order.
    pub fn certnames(&self) -> impl Iterator<Item = &str> + '_ {
        self.by_certname.iter().map(|p| self.server(*p).certname())
    }
}
