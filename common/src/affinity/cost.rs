//! The cost model behind the `cost` affinity policy: estimated compute time
//! of a node on a device plus transfer time of tensors crossing devices.

use std::collections::HashMap;

use super::DeviceId;
use crate::graph::{numel, Graph, NodeId};

/// Decides between devices when several support a node.
///
/// Implementations must be deterministic: the same inputs give the same
/// numbers.
pub trait CostModel {
    /// Estimated time (µs) to run `node` on `device`.
    fn compute_us(&self, graph: &Graph, node: NodeId, device: &DeviceId) -> f64;
    /// Estimated time (µs) to move `bytes` from `from` to `to` (0 when equal).
    fn transfer_us(&self, bytes: u64, from: &DeviceId, to: &DeviceId) -> f64;
}

/// Throughput figures of one device (what plugins will report as metrics).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceProfile {
    /// Sustained compute, GFLOP/s.
    pub gflops: f64,
    /// Memory bandwidth, GB/s.
    pub mem_gbps: f64,
    /// Fixed cost per node (kernel launch, dispatch), µs.
    pub launch_us: f64,
}

/// Bandwidth and latency of a link between two devices.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkProfile {
    /// GB/s.
    pub gbps: f64,
    /// µs per transfer.
    pub latency_us: f64,
}

/// Elements assumed for a tensor whose shape is not statically known.
pub const DEFAULT_NUMEL: u64 = 65_536;
/// Bytes per element assumed when the element type is unknown.
pub const DEFAULT_ELEM_BYTES: u64 = 4;

/// Work of one node: floating-point operations and bytes touched.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpWork {
    pub flops: f64,
    pub bytes: f64,
}

/// The default analytic model: FLOPs and bytes per op family from static
/// shapes, a roofline `max(flops / throughput, bytes / bandwidth) + launch`
/// per device, and `latency + bytes / bandwidth` per link.
#[derive(Debug, Clone)]
pub struct AnalyticCostModel {
    /// Profiles of specific devices (e.g. measured and reported by workers).
    pub devices: HashMap<DeviceId, DeviceProfile>,
    /// Profiles by device kind (`CPU`, `GPU`, ...) for devices not listed.
    pub kinds: HashMap<String, DeviceProfile>,
    /// Profile for anything else.
    pub fallback: DeviceProfile,
    /// Between two devices of the same host.
    pub intra_host: LinkProfile,
    /// Between hosts without a profile of their own.
    pub inter_host: LinkProfile,
    /// Each host's own link (its latency to the network, its bandwidth):
    /// between two hosts that have one, the latencies add up and the
    /// slower bandwidth counts.
    pub host_links: HashMap<String, LinkProfile>,
}

impl Default for AnalyticCostModel {
    fn default() -> Self {
        let kinds = HashMap::from([
            (
                "CPU".to_string(),
                DeviceProfile {
                    gflops: 50.0,
                    mem_gbps: 20.0,
                    launch_us: 2.0,
                },
            ),
            (
                "GPU".to_string(),
                DeviceProfile {
                    gflops: 2_000.0,
                    mem_gbps: 200.0,
                    launch_us: 10.0,
                },
            ),
        ]);
        AnalyticCostModel {
            devices: HashMap::new(),
            kinds,
            fallback: DeviceProfile {
                gflops: 100.0,
                mem_gbps: 20.0,
                launch_us: 5.0,
            },
            intra_host: LinkProfile {
                gbps: 10.0,
                latency_us: 10.0,
            },
            inter_host: LinkProfile {
                gbps: 1.25,
                latency_us: 100.0,
            },
            host_links: HashMap::new(),
        }
    }
}

impl AnalyticCostModel {
    pub fn profile(&self, device: &DeviceId) -> DeviceProfile {
        self.devices
            .get(device)
            .or_else(|| self.kinds.get(device.kind()))
            .copied()
            .unwrap_or(self.fallback)
    }

    /// The link between two different hosts.
    pub fn between_hosts(&self, a: Option<&str>, b: Option<&str>) -> LinkProfile {
        let own = |h: Option<&str>| h.and_then(|h| self.host_links.get(h));
        match (own(a), own(b)) {
            (Some(x), Some(y)) => LinkProfile {
                gbps: x.gbps.min(y.gbps),
                latency_us: x.latency_us + y.latency_us,
            },
            _ => self.inter_host,
        }
    }
}

impl CostModel for AnalyticCostModel {
    fn compute_us(&self, graph: &Graph, node: NodeId, device: &DeviceId) -> f64 {
        let p = self.profile(device);
        let w = op_work(graph, node);
        (w.flops / (p.gflops * 1e3)).max(w.bytes / (p.mem_gbps * 1e3)) + p.launch_us
    }

    fn transfer_us(&self, bytes: u64, from: &DeviceId, to: &DeviceId) -> f64 {
        if from == to {
            return 0.0;
        }
        let link = if from.host == to.host {
            self.intra_host
        } else {
            self.between_hosts(from.host.as_deref(), to.host.as_deref())
        };
        link.latency_us + bytes as f64 / (link.gbps * 1e3)
    }
}

/// Bytes of a tensor, with the documented defaults for unknowns.
pub fn tensor_bytes(graph: &Graph, t: crate::graph::TensorId) -> u64 {
    let t = graph.tensor(t);
    let n = t.shape.as_deref().and_then(numel).unwrap_or(DEFAULT_NUMEL);
    n * t
        .elem_type
        .and_then(|e| e.size_bytes())
        .unwrap_or(DEFAULT_ELEM_BYTES)
}

fn tensor_numel(graph: &Graph, t: Option<crate::graph::TensorId>) -> f64 {
    t.and_then(|t| graph.tensor(t).shape.as_deref().and_then(numel))
        .unwrap_or(DEFAULT_NUMEL) as f64
}

fn dims(graph: &Graph, t: Option<crate::graph::TensorId>) -> Vec<Option<i64>> {
    t.and_then(|t| graph.tensor(t).shape.as_ref())
        .map(|s| s.iter().map(|d| d.known()).collect())
        .unwrap_or_default()
}

/// How an op's FLOPs follow from its tensors' shapes (unknown dims take
/// the defaults noted).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CostRule {
    /// 2 × output elements × the shared dim (input 0's last; 64 unknown).
    MatMul,
    /// 2 × output elements × A's second dim (64 unknown).
    Gemm,
    /// 2 × output elements × input channels per group × kernel volume
    /// (16 and 3 per spatial dim unknown).
    Conv,
    /// 2 × input elements × output channels per group × kernel volume.
    ConvTranspose,
    /// Output elements × a 3×3 window.
    Window,
    /// This many FLOPs per input element.
    PerInput(f64),
    /// This many FLOPs per output element (1 for ops without a rule).
    PerOutput(f64),
    /// Moves or reinterprets data: no FLOPs, only bytes.
    Free,
}

/// The op types with a cost rule other than one FLOP per output element.
pub(crate) const RULES: &[(&str, CostRule)] = &[
    ("MatMul", CostRule::MatMul),
    ("MatMulInteger", CostRule::MatMul),
    ("QLinearMatMul", CostRule::MatMul),
    ("Gemm", CostRule::Gemm),
    ("Conv", CostRule::Conv),
    ("ConvInteger", CostRule::Conv),
    ("QLinearConv", CostRule::Conv),
    ("ConvTranspose", CostRule::ConvTranspose),
    ("MaxPool", CostRule::Window),
    ("AveragePool", CostRule::Window),
    ("LpPool", CostRule::Window),
    ("GlobalAveragePool", CostRule::PerInput(1.0)),
    ("GlobalMaxPool", CostRule::PerInput(1.0)),
    ("ReduceMean", CostRule::PerInput(1.0)),
    ("ReduceSum", CostRule::PerInput(1.0)),
    ("ReduceMax", CostRule::PerInput(1.0)),
    ("ReduceMin", CostRule::PerInput(1.0)),
    ("ReduceProd", CostRule::PerInput(1.0)),
    ("ReduceL2", CostRule::PerInput(1.0)),
    ("Softmax", CostRule::PerInput(5.0)),
    ("LogSoftmax", CostRule::PerInput(5.0)),
    ("LayerNormalization", CostRule::PerInput(5.0)),
    ("BatchNormalization", CostRule::PerInput(5.0)),
    ("InstanceNormalization", CostRule::PerInput(5.0)),
    ("GroupNormalization", CostRule::PerInput(5.0)),
    ("Sigmoid", CostRule::PerOutput(4.0)),
    ("Tanh", CostRule::PerOutput(4.0)),
    ("Erf", CostRule::PerOutput(4.0)),
    ("Gelu", CostRule::PerOutput(4.0)),
    ("Exp", CostRule::PerOutput(4.0)),
    ("Log", CostRule::PerOutput(4.0)),
    ("HardSwish", CostRule::PerOutput(4.0)),
    ("Swish", CostRule::PerOutput(4.0)),
    ("Mish", CostRule::PerOutput(4.0)),
    ("Softplus", CostRule::PerOutput(4.0)),
    ("Pow", CostRule::PerOutput(4.0)),
    ("Sqrt", CostRule::PerOutput(4.0)),
    ("Reshape", CostRule::Free),
    ("Flatten", CostRule::Free),
    ("Squeeze", CostRule::Free),
    ("Unsqueeze", CostRule::Free),
    ("Identity", CostRule::Free),
    ("Shape", CostRule::Free),
    ("Size", CostRule::Free),
    ("Constant", CostRule::Free),
    ("Transpose", CostRule::Free),
    ("Concat", CostRule::Free),
    ("Slice", CostRule::Free),
    ("Split", CostRule::Free),
    ("Gather", CostRule::Free),
    ("Expand", CostRule::Free),
    ("Tile", CostRule::Free),
    ("Cast", CostRule::Free),
    ("ConstantOfShape", CostRule::Free),
    ("Pad", CostRule::Free),
    ("Resize", CostRule::Free),
    ("DepthToSpace", CostRule::Free),
    ("SpaceToDepth", CostRule::Free),
];

/// FLOPs and bytes of a node, by its op's [`CostRule`].
pub fn op_work(graph: &Graph, node: NodeId) -> OpWork {
    let n = graph.node(node);
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let out0 = n.outputs.first().copied().flatten();
    let out_numel = tensor_numel(graph, out0);
    let in_numel = tensor_numel(graph, input(0));
    let bytes: u64 = n
        .inputs
        .iter()
        .flatten()
        .chain(n.outputs.iter().flatten())
        .map(|&t| tensor_bytes(graph, t))
        .sum();
    let kernel_volume = |w: &[Option<i64>]| {
        w.iter()
            .skip(2)
            .map(|d| d.unwrap_or(3) as f64)
            .product::<f64>()
    };
    let dim = |k: usize, at: usize, unknown: i64| {
        dims(graph, input(k))
            .get(at)
            .copied()
            .flatten()
            .unwrap_or(unknown) as f64
    };
    let rule = crate::ops::entry(&n.op_type).map_or(CostRule::PerOutput(1.0), |e| e.cost);
    let flops = match rule {
        CostRule::MatMul => {
            let k = dims(graph, input(0))
                .last()
                .copied()
                .flatten()
                .unwrap_or(64) as f64;
            2.0 * out_numel * k
        }
        CostRule::Gemm => 2.0 * out_numel * dim(0, 1, 64),
        CostRule::Conv => 2.0 * out_numel * dim(1, 1, 16) * kernel_volume(&dims(graph, input(1))),
        CostRule::ConvTranspose => {
            2.0 * in_numel * dim(1, 1, 16) * kernel_volume(&dims(graph, input(1)))
        }
        CostRule::Window => out_numel * 9.0,
        CostRule::PerInput(f) => in_numel * f,
        CostRule::PerOutput(f) => out_numel * f,
        CostRule::Free => 0.0,
    };
    OpWork {
        flops,
        bytes: bytes as f64,
    }
}
