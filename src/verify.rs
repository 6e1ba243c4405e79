//! `shardmq verify --data-dir DIR`: checks a stopped node's stores offline and says what it
//! found (the checks are `shards::store::verify`). Exit status 0: no damage; 1: damage found;
//! 2: the directory could not be read as a store.

use std::path::{Path, PathBuf};

use clap::Args;
use shards::store::verify::{verify_store, VerifyReport};

#[derive(Args)]
pub struct VerifyArgs {
    /// A node's data directory (its `shard-<i>` stores are checked) or one shard's directory.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Commitlog segment size; by default inferred from the segment names.
    #[arg(long)]
    pub segment_size_mib: Option<u64>,
}

/// The stores under `dir`: its `shard-<i>` directories, or `dir` itself when it is one.
fn stores_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    if dir.join("commitlog").is_dir() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut shards: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().to_str()?.to_string();
            let id = name.strip_prefix("shard-")?.parse().ok()?;
            Some((id, entry.path()))
        })
        .filter(|(_, path)| path.join("commitlog").is_dir())
        .collect();
    shards.sort();
    Ok(shards.into_iter().map(|(_, path)| path).collect())
}

fn print_report(report: &VerifyReport) {
    println!("store {}", report.root.display());
    println!(
        "  commitlog: {} segment(s) of {} MiB, {} records ({} MiB), log {}..{}",
        report.segments,
        report.segment_size_bytes >> 20,
        report.records,
        report.record_bytes >> 20,
        report.log_start,
        report.log_end
    );
    println!(
        "  consume queues: {} queue(s), {} unit(s) checked, {} expired, {} past the log end",
        report.queues, report.units, report.expired_units, report.units_past_end
    );
    println!(
        "  index: {} file(s), {} entries; config: {} file(s) parsed",
        report.index_files, report.index_entries, report.config_files
    );
    for note in &report.notes {
        println!("  note: {note}");
    }
    for finding in &report.findings {
        println!("  DAMAGE: {finding}");
    }
    if report.damage as usize > report.findings.len() {
        println!(
            "  … and {} more",
            report.damage as usize - report.findings.len()
        );
    }
    println!(
        "  {}",
        if report.damage == 0 {
            "no damage found".to_string()
        } else {
            format!("{} damaged place(s)", report.damage)
        }
    );
}

/// Runs the command; returns the exit status.
pub fn run(args: &VerifyArgs) -> i32 {
    let stores = match stores_in(&args.data_dir) {
        Ok(stores) if !stores.is_empty() => stores,
        Ok(_) => {
            eprintln!(
                "shardmq verify: {} holds no store (no commitlog/ and no shard-<i>/commitlog/)",
                args.data_dir.display()
            );
            return 2;
        }
        Err(error) => {
            eprintln!(
                "shardmq verify: cannot read {}: {error}",
                args.data_dir.display()
            );
            return 2;
        }
    };
    let size = args.segment_size_mib.map(|mib| mib << 20);
    let mut damage = 0;
    for store in stores {
        match verify_store(&store, size) {
            Ok(report) => {
                print_report(&report);
                damage += report.damage;
            }
            Err(error) => {
                eprintln!("shardmq verify: {}: {error}", store.display());
                return 2;
            }
        }
    }
    if damage > 0 {
        println!("verify: {damage} damaged place(s) found");
        1
    } else {
        println!("verify: no damage found");
        0
    }
}
