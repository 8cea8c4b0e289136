//! Models of real allocation patterns, used to generate the bundled traces that the
//! fragmentation benchmark and tests replay: a transformer training step (activations kept
//! for backward, gradients, optimizer state) and a kernel pipeline with a workspace per
//! stage over batches of varying size.

use std::sync::Arc;

use crate::trace::{TraceAction, TraceEvent};

/// Writes allocation and free events with unique addresses and the current stage.
#[derive(Debug, Default)]
struct TraceBuilder {
    events: Vec<TraceEvent>,
    next_address: u64,
    stage: Option<Arc<str>>,
}

impl TraceBuilder {
    fn stage(&mut self, name: String) {
        self.stage = Some(Arc::from(name));
    }

    fn alloc(&mut self, bytes: u64) -> u64 {
        self.next_address += 0x1000;
        let address = self.next_address;
        self.events.push(TraceEvent::new(
            TraceAction::Alloc,
            address,
            bytes,
            self.stage.clone(),
        ));
        address
    }

    fn free(&mut self, address: u64) {
        let size = self
            .events
            .iter()
            .rev()
            .find(|event| event.address == address && event.action == TraceAction::Alloc)
            .map_or(0, |event| event.requested);
        self.events.push(TraceEvent::new(
            TraceAction::Free,
            address,
            size,
            self.stage.clone(),
        ));
    }
}

/// Shape of a decoder-only transformer and its batches.
#[derive(Debug, Clone)]
pub struct TransformerStep {
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub vocab: u64,
    pub batch: u64,
    /// Sequence length of each training step; varying lengths are what dynamic batching does.
    pub sequence_lengths: Vec<u64>,
    /// Bytes per element of parameters and activations (2 for bf16).
    pub element_bytes: u64,
}

impl Default for TransformerStep {
    fn default() -> Self {
        TransformerStep {
            layers: 4,
            hidden: 1024,
            heads: 16,
            vocab: 32_000,
            batch: 4,
            sequence_lengths: vec![512, 384, 448],
            element_bytes: 2,
        }
    }
}

impl TransformerStep {
    /// The allocation trace of the configured training steps, PyTorch-style: parameters,
    /// then per step the forward pass keeps activations for backward, the backward pass
    /// frees them as it produces gradients, and the optimizer allocates its state lazily
    /// on the first step and frees the gradients (`zero_grad(set_to_none=True)`).
    pub fn trace(&self) -> Vec<TraceEvent> {
        let (h, e) = (self.hidden, self.element_bytes);
        let mut trace = TraceBuilder::default();
        trace.stage("parameters".into());
        let layer_params = [
            3 * h * h,
            3 * h,
            h * h,
            h,
            4 * h * h,
            4 * h,
            4 * h * h,
            h,
            h,
            h,
            h,
            h,
        ];
        let mut parameter_sizes = vec![self.vocab * h * e];
        for _ in 0..self.layers {
            parameter_sizes.extend(layer_params.iter().map(|elements| elements * e));
        }
        let _parameters: Vec<u64> = parameter_sizes
            .iter()
            .map(|&bytes| trace.alloc(bytes))
            .collect();
        let mut optimizer_state: Vec<u64> = Vec::new();
        for (step, &s) in self.sequence_lengths.iter().enumerate() {
            let tokens = self.batch * s;
            let act = tokens * h * e;
            let scores = self.batch * self.heads * s * s * e;
            trace.stage(format!("step{step}.forward.embedding"));
            let input_ids = trace.alloc(tokens * 8);
            let mut x = trace.alloc(act);
            let mut saved: Vec<Vec<u64>> = Vec::new();
            for layer in 0..self.layers {
                trace.stage(format!("step{step}.forward.layer{layer}"));
                let ln1 = trace.alloc(act);
                let qkv = trace.alloc(3 * act);
                let raw_scores = trace.alloc(scores);
                let probs = trace.alloc(scores);
                trace.free(raw_scores);
                let dropout_mask = trace.alloc(scores / e);
                let context = trace.alloc(act);
                let attn_out = trace.alloc(act);
                let residual = trace.alloc(act);
                let ln2 = trace.alloc(act);
                let up = trace.alloc(4 * act);
                let gelu = trace.alloc(4 * act);
                let down = trace.alloc(act);
                let out = trace.alloc(act);
                trace.free(attn_out);
                trace.free(down);
                saved.push(vec![
                    x,
                    ln1,
                    qkv,
                    probs,
                    dropout_mask,
                    context,
                    residual,
                    ln2,
                    up,
                    gelu,
                ]);
                x = out;
            }
            trace.stage(format!("step{step}.loss"));
            let logits = trace.alloc(tokens * self.vocab * e);
            let loss_tmp = trace.alloc(tokens * self.vocab * 4);
            let loss = trace.alloc(4);
            trace.free(loss_tmp);
            trace.stage(format!("step{step}.backward.loss"));
            let grad_logits = trace.alloc(tokens * self.vocab * e);
            trace.free(logits);
            let mut grads: Vec<u64> = vec![trace.alloc(parameter_sizes[0])];
            let mut grad_x = trace.alloc(act);
            trace.free(grad_logits);
            trace.free(x);
            for layer in (0..self.layers).rev() {
                trace.stage(format!("step{step}.backward.layer{layer}"));
                let offset = 1 + layer as usize * layer_params.len();
                for &bytes in &parameter_sizes[offset..offset + layer_params.len()] {
                    grads.push(trace.alloc(bytes));
                }
                let activations = saved.pop().unwrap_or_default();
                for (index, &activation) in activations.iter().enumerate().rev() {
                    let grad_tmp = trace.alloc(if index == 3 { scores } else { act });
                    trace.free(activation);
                    trace.free(grad_tmp);
                }
                let next_grad = trace.alloc(act);
                trace.free(grad_x);
                grad_x = next_grad;
            }
            trace.free(grad_x);
            trace.free(input_ids);
            trace.free(loss);
            trace.stage(format!("step{step}.optimizer"));
            if optimizer_state.is_empty() {
                for &bytes in &parameter_sizes {
                    optimizer_state.push(trace.alloc(bytes * 2));
                    optimizer_state.push(trace.alloc(bytes * 2));
                }
            }
            for (&grad, &bytes) in grads.iter().zip(&parameter_sizes) {
                let update = trace.alloc(bytes * 2);
                trace.free(update);
                trace.free(grad);
            }
        }
        trace.events
    }
}

/// A deterministic generator (SplitMix64), so bundled traces regenerate byte for byte.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

/// An image pipeline of kernels over batches of varying size, each stage with its own
/// scratch workspace (im2col, FFT, sort temp storage) plus small index buffers.
#[derive(Debug, Clone)]
pub struct KernelPipeline {
    pub batches: u64,
    pub max_batch: u64,
    pub image_side: u64,
    pub seed: u64,
}

impl Default for KernelPipeline {
    fn default() -> Self {
        KernelPipeline {
            batches: 40,
            max_batch: 32,
            image_side: 224,
            seed: 5,
        }
    }
}

impl KernelPipeline {
    /// The allocation trace of the configured batches.
    pub fn trace(&self) -> Vec<TraceEvent> {
        let mut random = SplitMix64(self.seed);
        let mut trace = TraceBuilder::default();
        let pixels = self.image_side * self.image_side;
        trace.stage("setup".into());
        let _filters = trace.alloc(64 * 3 * 7 * 7 * 4);
        let _lookup = trace.alloc(256 * 4);
        for batch_index in 0..self.batches {
            let n = random.between(1, self.max_batch);
            trace.stage(format!("batch{batch_index}.decode"));
            let raw = trace.alloc(n * pixels * 3);
            let offsets = trace.alloc(n * 8);
            let workspace = trace.alloc((n * 64) << 10);
            let decoded = trace.alloc(n * pixels * 3 * 4);
            trace.free(workspace);
            trace.free(raw);

            trace.stage(format!("batch{batch_index}.conv"));
            let columns = trace.alloc(n * pixels / 4 * 3 * 49 * 4);
            let features = trace.alloc(n * pixels / 4 * 64 * 4);
            trace.free(columns);
            trace.free(decoded);

            trace.stage(format!("batch{batch_index}.fft"));
            let fft_workspace = trace.alloc(n * pixels / 4 * 64 * 8 / 4);
            let spectrum = trace.alloc(n * pixels / 16 * 64 * 8);
            trace.free(fft_workspace);

            trace.stage(format!("batch{batch_index}.topk"));
            let keys = n * pixels / 16 * 64;
            let sort_temp = trace.alloc(keys * 8 + (random.between(1, 64) << 10));
            let indices = trace.alloc(n * 100 * 8);
            let scores = trace.alloc(n * 100 * 4);
            trace.free(sort_temp);
            trace.free(spectrum);
            trace.free(features);

            trace.stage(format!("batch{batch_index}.output"));
            let boxes = trace.alloc(n * 100 * 16);
            trace.free(indices);
            trace.free(scores);
            trace.free(offsets);
            trace.free(boxes);
        }
        trace.events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::{replay, PowerOfTwoBins};

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe code and thousands of events: too slow to interpret"
    )]
    fn generated_traces_free_everything_they_allocate_per_step() {
        for events in [
            TransformerStep::default().trace(),
            KernelPipeline::default().trace(),
        ] {
            let report = replay(&events, PowerOfTwoBins::new()).unwrap();
            assert!(report.peak_requested > 100 << 20, "{report:?}");
            assert!(
                report.live_at_end > 0,
                "parameters and setup buffers stay live"
            );
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe code and thousands of events: too slow to interpret"
    )]
    fn generation_is_deterministic() {
        assert_eq!(
            KernelPipeline::default().trace(),
            KernelPipeline::default().trace()
        );
    }
}
