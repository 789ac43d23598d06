//! Open a model and generate: one chat turn (or --raw completion), streamed.
//!
//! usage: cargo run --example generate -- MODEL.cmf [PROMPT] [--raw] [-n N]
use std::io::Write;
use std::ops::ControlFlow;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut model_path, mut prompt, mut raw, mut n) = (None, None, false, 64u32);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--raw" => raw = true,
            "-n" => n = args.next().ok_or("-n needs a value")?.parse()?,
            "-h" | "--help" => {
                println!("usage: generate MODEL.cmf [PROMPT] [--raw] [-n N]");
                return Ok(());
            }
            _ if model_path.is_none() => model_path = Some(a),
            _ => prompt = Some(a),
        }
    }
    let model_path = model_path.ok_or("usage: generate MODEL.cmf [PROMPT] [--raw] [-n N]")?;
    let prompt = prompt.unwrap_or_else(|| "Tell me about Mr. Darcy.".to_string());

    let rt = cmf::Runtime::new()?;
    let model = rt.open(&model_path)?;
    let mut session = model.session(&cmf::SessionOptions::default())?;
    let text = if raw { prompt } else { model.render_chat(&[("user", &prompt)], true)? };
    session.generate_text(&text, &cmf::GenerateOptions::greedy(n), |piece| {
        print!("{}", piece);
        let _ = std::io::stdout().flush();
        ControlFlow::Continue(())
    })?;
    println!();
    Ok(())
}
