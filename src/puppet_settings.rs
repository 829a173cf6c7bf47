//! What Puppet tells puppet-kicker about its own layout, as the bindings read it
//! from `Puppet.settings`: the input of the configuration and of each source's
//! defaults.

use std::path::PathBuf;

/// What Puppet tells us about its own layout; the bindings read these from
/// `Puppet.settings` (never hard-coded: puppetserver and agents differ).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PuppetSettings {
    pub confdir: PathBuf,
    pub vardir: PathBuf,
    /// `Puppet[:server_datadir]`; `$vardir/server_data` when not given.
    pub server_datadir: Option<PathBuf>,
    /// `PUPPET_KICKER_CONFIG`, read by the caller (JRuby's ENV is not the process's).
    pub config_file: Option<PathBuf>,
    /// `Puppet[:hostcert]`, `[:hostprivkey]`, `[:localcacert]`, `[:hostcrl]`: the
    /// master's own identity, what the PuppetDB source presents and trusts by default.
    pub hostcert: Option<PathBuf>,
    pub hostprivkey: Option<PathBuf>,
    pub localcacert: Option<PathBuf>,
    pub hostcrl: Option<PathBuf>,
}
