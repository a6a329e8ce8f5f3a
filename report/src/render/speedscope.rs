//! speedscope's file format (www.speedscope.app/file-format-schema.json, published in the
//! `speedscope` npm package): sampled profiles weighted by bytes, two per device (allocated
//! over the run, and in use at the chosen moment), frames shared between them.

use rustc_hash::FxHashMap;
use serde_json::{Value, json};

use crate::analysis::groups::no_stack_frame;
use crate::analysis::profile::ProfileSample;
use crate::render::{device_name, device_order};
use crate::symbols::SymFrame;

/// The schema's URL, which a speedscope file names.
const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// The document: `name` titles it, `inuse` names the in-use moment ("live at the peak").
pub fn document(samples: &[ProfileSample], name: &str, inuse: &str) -> Value {
    let mut frames: Vec<Value> = Vec::new();
    let mut frame_index: FxHashMap<(String, String, u32), usize> = FxHashMap::default();
    let placeholder = [no_stack_frame()];
    let mut index_of = |frame: &SymFrame| -> usize {
        let name = frame
            .function
            .as_deref()
            .map_or_else(|| frame.label(), str::to_string);
        let file = frame.file.as_deref().unwrap_or(&frame.module).to_string();
        let line = frame.line.unwrap_or(0);
        *frame_index
            .entry((name.clone(), file.clone(), line))
            .or_insert_with(|| {
                let mut value = json!({"name": name});
                if !file.is_empty() {
                    value["file"] = json!(file);
                }
                if line > 0 {
                    value["line"] = json!(line);
                }
                frames.push(value);
                frames.len() - 1
            })
    };

    let mut devices: Vec<i32> = samples.iter().map(|s| s.device).collect();
    devices.sort_by_key(|d| device_order(*d));
    devices.dedup();
    let mut profiles = Vec::new();
    for device in devices {
        for (what, pick) in [
            (
                "allocated over the run",
                (|s: &ProfileSample| s.alloc_bytes) as fn(&ProfileSample) -> u64,
            ),
            (inuse, |s: &ProfileSample| s.inuse_bytes),
        ] {
            let mut stacks = Vec::new();
            let mut weights = Vec::new();
            for sample in samples.iter().filter(|s| s.device == device) {
                let weight = pick(sample);
                if weight == 0 {
                    continue;
                }
                let frames = if sample.frames.is_empty() {
                    &placeholder[..]
                } else {
                    &sample.frames[..]
                };
                // speedscope lists a stack from its root: outermost first.
                let stack: Vec<usize> = frames.iter().rev().map(&mut index_of).collect();
                stacks.push(stack);
                weights.push(weight);
            }
            let total: u64 = weights.iter().sum();
            profiles.push(json!({
                "type": "sampled",
                "name": format!("{}: {what}", device_name(device)),
                "unit": "bytes",
                "startValue": 0,
                "endValue": total,
                "samples": stacks,
                "weights": weights,
            }));
        }
    }
    json!({
        "$schema": SCHEMA,
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": format!("vramshim {}", env!("CARGO_PKG_VERSION")),
    })
}
