//! What the worker tests' drivers share: the host contract a `Driver`
//! extends, for a driver that builds its own tools.

/// Implement `cairn_host::SessionHost` for `$driver`: default settings, and
/// no tools of the host's (the worker never asks the host to equip a
/// session file; the driver's `drive` builds its own).
#[macro_export]
macro_rules! own_tools_host {
    ($driver:ty) => {
        impl cairn_host::SessionHost for $driver {
            fn session_config(&self) -> cairn_core::SessionConfig {
                cairn_core::SessionConfig::default()
            }

            fn turn(
                &self,
                _: &std::path::Path,
                _: &mut cairn_core::storage::JsonlStore,
                _: Option<&str>,
                _: &cairn_core::approval::PolicyApprover,
                _: Option<&cairn_core::approval::SharedApprover>,
            ) -> anyhow::Result<(cairn_host::HostTools, cairn_core::SessionConfig)> {
                let tools = cairn_host::HostTools { tools: vec![], notes: vec![], hooks: None };
                Ok((tools, cairn_host::SessionHost::session_config(self)))
            }
        }
    };
}
