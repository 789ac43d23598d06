// Links libcmf: from $CMF_LIB_DIR when set (a build tree), else where
// `pkg-config --libs cmf` says (an installed tree), else the linker's
// default search path. Standard library only.
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CMF_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if let Ok(dir) = env::var("CMF_LIB_DIR") {
        println!("cargo:rustc-link-search=native={}", dir);
    } else if let Ok(out) = Command::new("pkg-config").args(["--libs-only-L", "cmf"]).output() {
        if out.status.success() {
            for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    println!("cargo:rustc-link-search=native={}", dir);
                }
            }
        }
    }
    println!("cargo:rustc-link-lib=dylib=cmf");
}
