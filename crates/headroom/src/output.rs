//! What a command prints on stdout: JSON for scripts (`--json`), or text for people.

/// Prints `value` as JSON when `json`, else the text `human` makes. A reader that has gone
/// (`| head`) is no error.
pub fn print<T: serde::Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let text = if json {
        serde_json::to_string_pretty(value)? + "\n"
    } else {
        human()
    };
    headroom_output::print(text.as_bytes())?;
    Ok(())
}
