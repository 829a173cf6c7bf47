//! The arguments of `servers_with_role`: role names, or `/…/` regexes on the role fact.

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
    pub fn parse<S: AsRef<str>>(roles: &[S]) -> Result<RoleSelector> {
        let mut selector = RoleSelector::default();
        if roles.is_empty() {
            return Err(Error::Query("no role given".into()));
        }
        for role in roles.iter().map(AsRef::as_ref) {
            if role.is_empty() {
                return Err(Error::Query("a role name cannot be empty".into()));
            }
            match role.strip_prefix('/').and_then(|r| r.strip_suffix('/')) {
                Some(pattern) if role.len() >= 2 => selector
                    .patterns
                    .push(Regex::new(pattern).map_err(|e| Error::Query(format!("role {role}: invalid regex: {e}")))?),
                _ => selector.names.push(role.to_string()),
            }
        }
        Ok(selector)
    }

    pub fn names<S: Into<String>>(names: impl IntoIterator<Item = S>) -> RoleSelector {
        RoleSelector { names: names.into_iter().map(Into::into).collect(), patterns: Vec::new() }
    }
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
}
