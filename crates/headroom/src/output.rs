//! What a command prints on stdout: JSON for scripts (`--json`), or text for people.

/// Prints `value` as JSON when `json`, else the text `human` makes.
pub fn print<T: serde::Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", human());
    }
    Ok(())
}
