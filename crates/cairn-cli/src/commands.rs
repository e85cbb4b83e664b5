//! The commands that inspect or configure rather than run a turn.

use std::io::Write;

use anyhow::Result;

use crate::cli::{Context, exit};

/// `cairn config`: every setting, its value and where it came from.
pub fn config(ctx: &Context) -> Result<u8> {
    let mut out = std::io::stdout().lock();
    let found = if ctx.settings.config_file_found { "" } else { " (not present)" };
    writeln!(out, "config file: {}{found}", ctx.settings.config_file.display())?;
    writeln!(out, "data directory: {}", ctx.paths.data.display())?;
    writeln!(out, "sessions: {}", ctx.paths.sessions().display())?;
    let rows = ctx.settings.rows();
    let width = rows.iter().map(|(k, _, _)| k.len()).max().unwrap_or(0);
    for (key, value, source) in rows {
        writeln!(out, "{key:width$}  {value}  {}", ctx.out_style.dim(&format!("({source})")))?;
    }
    for name in ctx.settings.providers.keys() {
        writeln!(out, "providers.{name}  {}", ctx.out_style.dim(&format!("({})", ctx.settings.config_file.display())))?;
    }
    Ok(exit::SUCCESS)
}
