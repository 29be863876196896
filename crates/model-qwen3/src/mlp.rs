//! Feed-forward blocks: the dense SwiGLU MLP and the sparse MoE block.

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};

use crate::config::{MoeConfig, Qwen3Config};
use crate::row_invariant::{linear_rows, matmul_rows};

/// `down(silu(gate(x)) * up(x))`.
pub struct DenseMlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl DenseMlp {
    pub fn new(hidden: usize, intermediate: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            gate_proj: candle_nn::linear_no_bias(hidden, intermediate, vb.pp("gate_proj"))?,
            up_proj: candle_nn::linear_no_bias(hidden, intermediate, vb.pp("up_proj"))?,
            down_proj: candle_nn::linear_no_bias(intermediate, hidden, vb.pp("down_proj"))?,
        })
    }
}

impl Module for DenseMlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = candle_nn::ops::silu(&linear_rows(&self.gate_proj, x)?)?;
        linear_rows(&self.down_proj, &(g * linear_rows(&self.up_proj, x)?)?)
    }
}

/// Qwen3-MoE's sparse block: softmax router over all experts (f32), top-k,
/// optional renormalisation, weighted sum of the chosen experts' SwiGLU.
/// Expert weights are kept stacked: `gate_up [E, 2I, H]`, `down [E, H, I]`.
pub struct MoeBlock {
    router: Linear,
    gate_up: Tensor,
    down: Tensor,
    intermediate: usize,
    top_k: usize,
    norm_topk_prob: bool,
}

impl MoeBlock {
    pub fn new(cfg: &Qwen3Config, moe: &MoeConfig, vb: VarBuilder) -> Result<Self> {
        let (h, i, e) = (cfg.hidden_size, moe.moe_intermediate_size, moe.num_experts);
        let router = candle_nn::linear_no_bias(h, e, vb.pp("gate"))?;
        let ev = vb.pp("experts");
        // transformers 5 may save fused experts (no ".weight" suffix);
        // the hub and transformers' default save one tensor per expert.
        let (gate_up, down) = if ev.contains_tensor("gate_up_proj") {
            (ev.get((e, 2 * i, h), "gate_up_proj")?, ev.get((e, h, i), "down_proj")?)
        } else {
            let mut gu = Vec::with_capacity(e);
            let mut dn = Vec::with_capacity(e);
            for j in 0..e {
                let x = ev.pp(j.to_string());
                let g = x.get((i, h), "gate_proj.weight")?;
                let u = x.get((i, h), "up_proj.weight")?;
                gu.push(Tensor::cat(&[g, u], 0)?);
                dn.push(x.get((h, i), "down_proj.weight")?);
            }
            (Tensor::stack(&gu, 0)?, Tensor::stack(&dn, 0)?)
        };
        Ok(Self { router, gate_up, down, intermediate: i, top_k: moe.num_experts_per_tok, norm_topk_prob: moe.norm_topk_prob })
    }

    /// Per token: the chosen experts and their weights.
    fn route(&self, x: &Tensor) -> Result<Vec<Vec<(usize, f32)>>> {
        let logits = linear_rows(&self.router, x)?;
        let probs = candle_nn::ops::softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?.to_vec2::<f32>()?;
        Ok(probs
            .into_iter()
            .map(|p| {
                let mut idx: Vec<usize> = (0..p.len()).collect();
                // Stable sort by descending probability: ties go to the lower
                // expert index, as torch.topk does on CPU.
                idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
                idx.truncate(self.top_k);
                let sum: f32 = idx.iter().map(|&e| p[e]).sum();
                let norm = if self.norm_topk_prob { sum } else { 1.0 };
                idx.into_iter().map(|e| (e, p[e] / norm)).collect()
            })
            .collect())
    }
}

impl Module for MoeBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (t, h) = x.dims2()?;
        let routes = self.route(x)?;
        let num_experts = self.gate_up.dim(0)?;
        let mut per_expert: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); num_experts];
        for (tok, r) in routes.iter().enumerate() {
            for &(e, w) in r {
                per_expert[e].0.push(tok as u32);
                per_expert[e].1.push(w);
            }
        }
        let mut out = Tensor::zeros((t, h), x.dtype(), x.device())?;
        for (e, (toks, ws)) in per_expert.into_iter().enumerate() {
            if toks.is_empty() {
                continue;
            }
            let n = toks.len();
            let idx = Tensor::from_vec(toks, n, x.device())?;
            let xs = x.index_select(&idx, 0)?;
            let gu = matmul_rows(&xs, &self.gate_up.get(e)?.t()?)?; // [n, 2I]
            let g = candle_nn::ops::silu(&gu.narrow(1, 0, self.intermediate)?)?;
            let u = gu.narrow(1, self.intermediate, self.intermediate)?;
            let y = matmul_rows(&(g * u)?, &self.down.get(e)?.t()?)?; // [n, H]
            let w = Tensor::from_vec(ws, (n, 1), x.device())?.to_dtype(x.dtype())?;
            out = out.index_add(&idx, &y.broadcast_mul(&w)?, 0)?;
        }
        Ok(out)
    }
}

pub enum FeedForward {
    Dense(DenseMlp),
    Moe(MoeBlock),
}

impl FeedForward {
    pub fn new(cfg: &Qwen3Config, layer: usize, vb: VarBuilder) -> Result<Self> {
        match &cfg.moe {
            Some(moe) if cfg.is_moe_layer(layer) => Ok(Self::Moe(MoeBlock::new(cfg, moe, vb)?)),
            _ => Ok(Self::Dense(DenseMlp::new(cfg.hidden_size, cfg.intermediate_size, vb)?)),
        }
    }
}

impl Module for FeedForward {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Dense(m) => m.forward(x),
            Self::Moe(m) => m.forward(x),
        }
    }
}
