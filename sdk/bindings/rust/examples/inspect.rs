//! Inspect a model: facts, its tensors, one tensor's first rows decoded to
//! f32, and a verify of every hash (with --trusted-key: the signature too).
//!
//! usage: cargo run --example inspect -- MODEL.cmf [--tensor NAME] [--trusted-key HEX]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut model_path, mut tensor, mut keys) = (None, "model.embed_tokens.weight".to_string(), Vec::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--tensor" => tensor = args.next().ok_or("--tensor needs a name")?,
            "--trusted-key" => keys.push(args.next().ok_or("--trusted-key needs a key")?),
            "-h" | "--help" => {
                println!("usage: inspect MODEL.cmf [--tensor NAME] [--trusted-key HEX]");
                return Ok(());
            }
            _ => model_path = Some(a),
        }
    }
    let model_path = model_path.ok_or("usage: inspect MODEL.cmf [--tensor NAME] [--trusted-key HEX]")?;
    let rt = cmf::Runtime::new()?;
    let model = rt.open(&model_path)?;
    let info = model.info()?;
    println!(
        "{}: arch {}, {}, {} tensors, {} shard(s)",
        model_path, info.arch_name, info.quant_type, info.tensor_count, info.shard_count
    );
    for t in model.tensors() {
        let t = t?;
        println!("  {:50} dtype {:2} {:?}", t.name, t.dtype, t.shape);
    }
    let t = model.tensor(&tensor)?;
    let rows = model.dequantize_rows(t.index, 0..t.rows().min(2))?;
    println!("{} rows 0..2, first values: {:?}", t.name, &rows[..rows.len().min(4)]);
    let report = model.verify(&cmf::VerifyOptions { trusted_keys: keys, ..Default::default() })?;
    for p in &report.problems {
        println!("problem: {}", p);
    }
    for s in &report.signatures {
        println!("signed by {} (trusted: {})", s.fingerprint, s.trusted);
    }
    println!("verify: {}", if report.ok() { "ok".to_string() } else { format!("{} problem(s)", report.problems.len()) });
    std::process::exit(if report.ok() { 0 } else { 1 });
}
