//! The arguments of `servers_with_role`: role names, or `/…/` regexes on the role fact.

use super::cost::{regex_cost, QUERY_BUDGET};
use crate::error::{Error, Result};
use regex::Regex;

/// Which roles `servers_with_role` asks for: any of `names` exactly, or any role
/// matching one of `patterns` (written `/…/` in the function's argument).
#[derive(Clone, Debug, Default)]
pub struct RoleSelector {
    pub names: Vec<String>,
    pub patterns: Vec<Regex>,
}

impl RoleSelector {
    /// Reads role arguments: `/…/` is a regex on the role fact, anything else a name.
    ///
    /// The regexes are priced before they are compiled, as a query's are
    /// ([`super::cost`]): together at most [`QUERY_BUDGET`], so that a role argument
    /// (a manifest's, or a kick's in a report) cannot hold a compile for long.
    pub fn parse<S: AsRef<str>>(roles: &[S]) -> Result<RoleSelector> {
        let mut selector = RoleSelector::default();
        if roles.is_empty() {
            return Err(Error::Query("no role given".into()));
        }
        let mut total: u64 = 0;
        for role in roles.iter().map(AsRef::as_ref) {
            if role.is_empty() {
                return Err(Error::Query("a role name cannot be empty".into()));
            }
            match role.strip_prefix('/').and_then(|r| r.strip_suffix('/')) {
                Some(pattern) if role.len() >= 2 => {
                    let cost = regex_cost(pattern).unwrap_or(0);
                    total = total.saturating_add(cost);
                    if total > QUERY_BUDGET {
                        return Err(Error::Query(too_costly(role, cost, total)));
                    }
                    let regex =
                        Regex::new(pattern).map_err(|e| Error::Query(format!("role {role}: invalid regex: {e}")))?;
                    selector.patterns.push(regex);
                }
                _ => selector.names.push(role.to_string()),
            }
        }
        Ok(selector)
    }

    pub fn names<S: Into<String>>(names: impl IntoIterator<Item = S>) -> RoleSelector {
        RoleSelector { names: names.into_iter().map(Into::into).collect(), patterns: Vec::new() }
    }
}

/// Why `role`'s regex is refused: it costs `cost`, the roles' regexes `total` by it.
fn too_costly(role: &str, cost: u64, total: u64) -> String {
    let what = if cost > QUERY_BUDGET {
        format!("its regex would take too long to compile (cost {cost}, at most {QUERY_BUDGET})")
    } else {
        format!("the roles' regexes would take too long to compile together (cost {total} by this role, at most {QUERY_BUDGET})")
    };
    format!("role {role}: {what}; use fewer character classes, or no (?i) with classes that span much of Unicode")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slashes_make_a_pattern_anything_else_a_name() {
        let selector = RoleSelector::parse(&["/^hap/", "node", "/", "//"]).unwrap();
        assert_eq!(selector.names, ["node", "/"]);
        let patterns: Vec<&str> = selector.patterns.iter().map(Regex::as_str).collect();
        assert_eq!(patterns, ["^hap", ""]);
    }

    #[test]
    fn bad_roles_are_query_errors_naming_the_role() {
        let invalid = RoleSelector::parse(&["/(?=x)/"]).unwrap_err().to_string();
        assert!(invalid.contains("role /(?=x)/: invalid regex"), "{invalid}");
        assert!(RoleSelector::parse::<&str>(&[]).unwrap_err().to_string().contains("no role given"));
        assert!(RoleSelector::parse(&["node", ""]).unwrap_err().to_string().contains("cannot be empty"));
    }

    #[test]
    fn costly_role_regexes_are_refused_by_name_before_they_are_compiled() {
        let costly = format!("/(?i){}/", "[^a[^b]]".repeat(8));
        let error = RoleSelector::parse(&["node", costly.as_str()]).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("role {costly}: its regex would take too long to compile (cost ")),
            "{error}"
        );

        // Each within the budget, not all of them together.
        let role = format!("/(?i){}/", "[[^a]]".repeat(3));
        assert!(RoleSelector::parse(&[role.as_str()]).is_ok());
        let error = RoleSelector::parse(&vec![role.as_str(); 4]).unwrap_err().to_string();
        assert!(error.contains("the roles' regexes would take too long to compile together"), "{error}");
    }

    #[test]
    fn everyday_role_regexes_are_within_the_budget() {
        let roles = ["/^hap/", "/^(web|app)[0-9]*$/", "/(?i)^db-(primary|replica)$/", "/\\w+-lb$/", "node"];
        let selector = RoleSelector::parse(&roles).unwrap();
        assert_eq!((selector.names.len(), selector.patterns.len()), (1, 4));
    }
}
