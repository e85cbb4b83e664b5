//! cairn's own secrets: the provider keys (and other credentials) in its
//! environment, moved into memory before any thread or child exists.
//!
//! This module owns the rule "a key lives in cairn's memory, never in its
//! environment": [`take_at_startup`] (first thing in `main`) removes every
//! variable whose name marks a credential; [`take_provider_keys`] (right
//! after the config file is read, still single-threaded) removes the
//! variables configured providers read (`api_key_env`, whatever the name)
//! and every variable carrying one of those values. Both wipe the bytes the
//! kernel shows as `/proc/PID/environ`. Providers read keys through [`var`];
//! tools get the values to scrub through [`values`]. It does not decide
//! what a tool may see beyond that (`cairn_tools::env` does).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use cairn_provider::{ProviderConfig, ProviderKind};
use cairn_tools::env::{SecretValues, is_credential_name, take_from_own_environment};

/// Variables taken out of the environment, by name, and the values to keep
/// away from tools.
#[derive(Default)]
struct Vault {
    vars: BTreeMap<String, String>,
    secrets: SecretValues,
}

static VAULT: Mutex<Option<Vault>> = Mutex::new(None);

fn vault() -> MutexGuard<'static, Option<Vault>> {
    VAULT.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn keep(taken: Vec<(String, String)>, provider_key: &dyn Fn(&str) -> bool) {
    let mut guard = vault();
    let vault = guard.get_or_insert_with(Vault::default);
    for (name, value) in taken {
        // A provider key is a secret at any length; a credential found by
        // its name only when long enough not to match ordinary values.
        if provider_key(&name) || value.trim().len() >= SecretValues::MIN_CONTAINED_LEN {
            vault.secrets.insert(&value);
        }
        vault.vars.entry(name).or_insert(value);
    }
}

/// Take every credential-named variable (`*KEY*`, `*TOKEN*`, `*SECRET*`,
/// `*PASSW*`, …, `OPENAI_API_KEY` and `ANTHROPIC_API_KEY` among them) out of
/// cairn's environment and make cairn non-dumpable, so no other process of
/// the same user can read its `/proc/PID/environ`, `maps` or `mem`.
///
/// # Safety
/// Call first thing in `main`, while cairn has a single thread.
pub unsafe fn take_at_startup() -> std::io::Result<()> {
    // SAFETY: single-threaded per this function's contract.
    let taken = unsafe { take_from_own_environment(&|name, _| is_credential_name(name)) };
    keep(taken, &|name| name == "OPENAI_API_KEY" || name == "ANTHROPIC_API_KEY");
    cairn_tools::sandbox::protect_host_process()
}

/// The key variables of every provider cairn knows: the built-ins and each
/// `[providers.NAME]` table of the config file (tables that do not parse
/// are skipped here; using them reports the error).
pub(crate) fn provider_key_vars(tables: &BTreeMap<String, toml::Value>) -> Vec<String> {
    let builtins = cairn_provider::BUILTIN_NAMES.iter().map(|n| ProviderConfig::resolve(n, None));
    let configured = tables.iter().map(|(name, table)| ProviderConfig::resolve(name, Some(table)));
    builtins
        .chain(configured)
        .filter_map(Result::ok)
        .filter(|c| {
            matches!(c.kind, ProviderKind::OpenAiChat | ProviderKind::OpenAiResponses | ProviderKind::Anthropic)
        })
        .map(|c| c.effective_key_env().to_owned())
        .collect()
}

/// Take the variables configured providers read their keys from (e.g.
/// `api_key_env = "LLM_PAT"`) out of cairn's environment, then every
/// variable whose value equals or contains a secret now held, whatever its
/// name.
///
/// # Safety
/// Call while cairn has a single thread (right after reading the config
/// file, before anything starts a thread or a child).
pub unsafe fn take_provider_keys(tables: &BTreeMap<String, toml::Value>) {
    let key_vars = provider_key_vars(tables);
    let is_key = |name: &str| key_vars.iter().any(|k| k == name);
    // SAFETY: single-threaded per this function's contract.
    let taken = unsafe { take_from_own_environment(&|name, _| is_key(name)) };
    keep(taken, &is_key);
    let secrets = values();
    if !secrets.is_empty() {
        // SAFETY: as above.
        let carriers = unsafe { take_from_own_environment(&|_, value| secrets.matches(value)) };
        keep(carriers, &|_| false);
    }
}

/// An environment variable as cairn saw it at startup: from the vault when
/// it was taken out, else from the environment.
pub fn var(name: &str) -> Option<String> {
    if let Some(v) = vault().as_ref().and_then(|v| v.vars.get(name)) {
        return Some(v.clone());
    }
    std::env::var(name).ok()
}

/// The secret values no tool's environment may carry.
pub fn values() -> SecretValues {
    vault().as_ref().map(|v| v.secrets.clone()).unwrap_or_default()
}
