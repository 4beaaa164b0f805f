//! The Rust side of `python/bench/throughput.py`: records the tensors of a safetensors file with
//! detcheck's Rust writer, as a Rust program would (`TraceWriter::record` of owned `Tensor`s),
//! and prints the time it took as one JSON line.
//!
//! `cargo run --release --manifest-path python/Cargo.toml --example writer_throughput --
//! TENSORS.safetensors DIR MODE STEPS`: loads the tensors (not timed), then times creating the
//! writer in DIR, recording every tensor (in name order) at each of STEPS steps, and `finish`.

use detcheck::file::{DumpMode, TraceWriter};
use detcheck::value::{DType, Tensor, TensorView};
use safetensors::{Dtype, SafeTensors};
use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

fn dtype(d: Dtype) -> Result<DType, String> {
    Ok(match d {
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        Dtype::I8 => DType::I8,
        Dtype::I16 => DType::I16,
        Dtype::U16 => DType::U16,
        Dtype::F8_E4M3 => DType::F8E4M3,
        Dtype::F8_E5M2 => DType::F8E5M2,
        Dtype::C64 => DType::C64,
        other => return Err(format!("unsupported dtype {other:?}")),
    })
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [file, dir, mode, steps] = args.as_slice() else {
        return Err("usage: writer_throughput TENSORS.safetensors DIR MODE STEPS".into());
    };
    let mode: DumpMode = mode.parse()?;
    let steps: u64 = steps.parse()?;
    let bytes = std::fs::read(file)?;
    let file = SafeTensors::deserialize(&bytes)?;
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for (name, view) in file.tensors() {
        let dtype = dtype(view.dtype())?;
        let tensor = TensorView::new(dtype, view.shape(), view.data())?.to_tensor();
        tensors.push((name, tensor));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let per_step: usize = tensors
        .iter()
        .map(|(_, t)| t.len() * t.dtype().size_of())
        .sum();

    let start = Instant::now();
    let mut writer = TraceWriter::create(&PathBuf::from(dir), 0, 1, mode)?;
    for step in 0..steps {
        for (name, tensor) in &tensors {
            writer.record(step, name, tensor)?;
        }
    }
    writer.finish()?;
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{{\"seconds\": {seconds}, \"bytes\": {}, \"records\": {}}}",
        per_step as u64 * steps,
        tensors.len() as u64 * steps
    );
    Ok(())
}
