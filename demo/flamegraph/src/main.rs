//! `otel-thread-ctx-flamegraph <folded> <svg> [title]`: renders folded
//! stacks (`frame;frame;frame count` per line, root first) as a flame graph
//! SVG with inferno. Used by `npm run demo` for its per-trace flame graphs.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output) = match (args.first(), args.get(1)) {
        (Some(i), Some(o)) => (i, o),
        _ => {
            eprintln!("usage: otel-thread-ctx-flamegraph <folded> <svg> [title]");
            return ExitCode::from(2);
        }
    };
    let mut options = inferno::flamegraph::Options::default();
    if let Some(title) = args.get(2) {
        options.title = title.clone();
    }
    options.count_name = "samples".to_string();
    let result = File::open(input).and_then(|reader| {
        let mut writer = BufWriter::new(File::create(output)?);
        inferno::flamegraph::from_reader(&mut options, BufReader::new(reader), &mut writer)
            .map_err(std::io::Error::other)?;
        writer.flush()
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("otel-thread-ctx-flamegraph: {input} -> {output}: {e}");
            ExitCode::FAILURE
        }
    }
}
