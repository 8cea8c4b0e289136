//! Regenerates the bundled allocation traces in `traces/` from the workload models, so the
//! fragmentation benchmark replays data whose origin is in the repository.
//!
//! `cargo run -p headroom-mem --example generate_traces`

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use headroom_mem::trace::write_rmm_csv;
use headroom_mem::workload::{KernelPipeline, TransformerStep};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces");
    std::fs::create_dir_all(&directory)?;
    for (name, events) in [
        ("transformer_step.csv", TransformerStep::default().trace()),
        ("kernel_pipeline.csv", KernelPipeline::default().trace()),
    ] {
        let path = directory.join(name);
        write_rmm_csv(&events, BufWriter::new(File::create(&path)?))?;
        println!("{}: {} events", path.display(), events.len());
    }
    Ok(())
}
