//! One wgpu device: adapter selection, the compute pipelines (compiled
//! once per kernel and shared by every subgraph), buffers and command
//! submission.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use crate::plugin::PluginError;

/// The kernels, by name, with their WGSL source.
pub const KERNELS: &[(&str, &str)] = &[
    ("binary", include_str!("shaders/binary.wgsl")),
    ("unary", include_str!("shaders/unary.wgsl")),
    ("copy", include_str!("shaders/copy.wgsl")),
    ("gemm", include_str!("shaders/gemm.wgsl")),
    ("conv", include_str!("shaders/conv.wgsl")),
    ("conv_gemm", include_str!("shaders/conv_gemm.wgsl")),
    ("conv_splitk", include_str!("shaders/conv_splitk.wgsl")),
    ("pool", include_str!("shaders/pool.wgsl")),
    (
        "global_pool",
        concat!(
            include_str!("shaders/global_pool.wgsl"),
            include_str!("shaders/workgroup_reduce.wgsl")
        ),
    ),
    ("softmax", include_str!("shaders/softmax.wgsl")),
    (
        "softmax_rows",
        concat!(
            include_str!("shaders/softmax_rows.wgsl"),
            include_str!("shaders/workgroup_reduce.wgsl")
        ),
    ),
    ("batchnorm", include_str!("shaders/batchnorm.wgsl")),
    ("reduce", include_str!("shaders/reduce.wgsl")),
    ("layernorm", include_str!("shaders/layernorm.wgsl")),
    ("resize", include_str!("shaders/resize.wgsl")),
    ("convtranspose", include_str!("shaders/convtranspose.wgsl")),
    ("cast_to_half", include_str!("shaders/cast_to_half.wgsl")),
    ("cast_to_float", include_str!("shaders/cast_to_float.wgsl")),
];

/// Kernels declare how tensors are stored with this line; their half
/// variant (adapters with shader-f16) stores f16 and still computes in f32.
const STORAGE_F32: &str = "alias T = f32;";

/// Where no adapter is found: how to get one.
const NO_ADAPTER_HELP: &str = "no GPU adapter found (for a software Vulkan adapter install \
     Mesa's lavapipe: apt-get install mesa-vulkan-drivers; TESSERA_GPU_BACKEND picks the \
     backend: vulkan, metal, dx12, gl)";

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub shader_f16: bool,
    /// Timestamps may be written between dispatches (per-node GPU times
    /// in the performance counters).
    pub timestamps: bool,
    pub max_binding: u64,
    /// The memory the adapter reports, bytes (0: none reported).
    pub memory_bytes: u64,
    /// Compiled pipelines by kernel and variant (f16 storage or not).
    pipelines: Mutex<HashMap<(&'static str, bool), Arc<wgpu::ComputePipeline>>>,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // What was submitted finishes before the device and its queue go
        // (and with them lavapipe's threads), on the thread that drops
        // the last reference.
        if let Err(e) = self.wait() {
            tracing::debug!("GPU work at teardown: {e}");
        }
    }
}

pub fn compile_error(reason: String) -> PluginError {
    PluginError::Compile {
        backend: "wgpu".into(),
        reason,
    }
}

fn unavailable(reason: String) -> PluginError {
    PluginError::Unavailable {
        plugin: "GPU".into(),
        reason,
    }
}

/// The backends `TESSERA_GPU_BACKEND` (or the config key) names.
pub fn backends(name: Option<&str>) -> Result<wgpu::Backends, PluginError> {
    Ok(match name.map(str::to_ascii_lowercase).as_deref() {
        None | Some("") | Some("auto") => wgpu::Backends::PRIMARY,
        Some("vulkan") => wgpu::Backends::VULKAN,
        Some("metal") => wgpu::Backends::METAL,
        Some("dx12") => wgpu::Backends::DX12,
        Some("gl") => wgpu::Backends::GL,
        Some(other) => {
            return Err(unavailable(format!(
                "unknown GPU backend '{other}' (expected vulkan, metal, dx12, gl or auto)"
            )))
        }
    })
}

/// The adapters of `backends`, in the order wgpu lists them.
pub fn adapters(backends: wgpu::Backends) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance(backends).enumerate_adapters(backends))
}

/// The process's instance for `backends`, made once and kept until the
/// process exits. A Vulkan instance's last release makes the Vulkan
/// loader unload the driver (lavapipe: `libvulkan_lvp.so`); an unloaded
/// driver was seen called into at exit (SIGSEGV in the main thread, at an
/// address where the driver had been), so the driver stays loaded for the
/// process's life and goes with the other libraries at exit, while devices
/// are dropped in order before (see `daemon::run_until`).
fn instance(backends: wgpu::Backends) -> wgpu::Instance {
    static INSTANCES: Mutex<Vec<(wgpu::Backends, wgpu::Instance)>> = Mutex::new(Vec::new());
    let mut all = INSTANCES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, instance)) = all.iter().find(|(b, _)| *b == backends) {
        return instance.clone();
    }
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = backends;
    let instance = wgpu::Instance::new(desc);
    all.push((backends, instance.clone()));
    instance
}

/// The memory an adapter offers: a software adapter (lavapipe) computes
/// in the machine's memory, so its available memory; a Vulkan GPU the sum
/// of its device-local heaps (wgpu itself reports no memory size).
fn adapter_memory(adapter: &wgpu::Adapter, info: &wgpu::AdapterInfo) -> Option<u64> {
    if info.device_type == wgpu::DeviceType::Cpu {
        return crate::memory::available_memory();
    }
    // SAFETY: the physical device and instance handles are only read here,
    // while `adapter` (which owns them) is alive; nothing is destroyed.
    let heaps = unsafe {
        let hal = adapter.as_hal::<wgpu::hal::api::Vulkan>()?;
        let instance = hal.shared_instance().raw_instance();
        instance.get_physical_device_memory_properties(hal.raw_physical_device())
    };
    // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT is 0x1.
    let local: u64 = heaps.memory_heaps
        [..(heaps.memory_heap_count as usize).min(heaps.memory_heaps.len())]
        .iter()
        .filter(|h| h.flags.as_raw() & 1 != 0)
        .map(|h| h.size)
        .sum();
    (local > 0).then_some(local)
}

impl Gpu {
    /// Opens adapter `index` of `backends`.
    pub fn open(backends: wgpu::Backends, index: usize) -> Result<Gpu, PluginError> {
        let mut all = adapters(backends);
        if all.is_empty() {
            return Err(unavailable(NO_ADAPTER_HELP.into()));
        }
        if index >= all.len() {
            return Err(unavailable(format!(
                "GPU.{index} does not exist; this machine has {} GPU adapter(s)",
                all.len()
            )));
        }
        let adapter = all.swap_remove(index);
        let info = adapter.get_info();
        let shader_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let timestamp_features =
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let timestamps = adapter.features().contains(timestamp_features);
        let limits = adapter.limits();
        let required_limits = wgpu::Limits {
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            max_buffer_size: limits.max_buffer_size,
            max_storage_buffers_per_shader_stage: limits
                .max_storage_buffers_per_shader_stage
                .min(8),
            ..wgpu::Limits::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("tessera"),
            required_features: adapter.features()
                & (timestamp_features | wgpu::Features::SHADER_F16),
            required_limits,
            ..Default::default()
        }))
        .map_err(|e| unavailable(format!("{}: {e}", info.name)))?;
        // Errors outside an error scope are logged, never a panic.
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            tracing::error!("GPU: {e}");
        }));
        let memory_bytes = adapter_memory(&adapter, &info).unwrap_or(0);
        let gpu = Gpu {
            device,
            queue,
            max_binding: limits.max_storage_buffer_binding_size,
            memory_bytes,
            info,
            shader_f16,
            timestamps,
            pipelines: Mutex::new(HashMap::new()),
        };
        // Every f32 kernel compiled once, now (f16 variants when a
        // subgraph first needs them).
        for (name, source) in KERNELS {
            if !source.contains("enable f16;") {
                gpu.pipeline(name, false)?;
            }
        }
        Ok(gpu)
    }

    /// Runs `f` inside a validation error scope: wgpu's errors become ours.
    pub fn scoped<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T, PluginError> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        match pollster::block_on(scope.pop()) {
            Some(e) => Err(compile_error(format!("{what}: {e}"))),
            None => Ok(out),
        }
    }

    /// The pipeline of kernel `name`, its f16-storage variant if `half`,
    /// compiled on first use.
    pub fn pipeline(
        &self,
        name: &str,
        half: bool,
    ) -> Result<Arc<wgpu::ComputePipeline>, PluginError> {
        let mut cache = self
            .pipelines
            .lock()
            .map_err(|_| compile_error("pipeline cache poisoned".into()))?;
        let (key, source) = KERNELS
            .iter()
            .find(|(k, _)| *k == name)
            .ok_or_else(|| compile_error(format!("no kernel {name}")))?;
        // Kernels with a fixed storage type have no variants.
        let half = half && source.contains(STORAGE_F32);
        if let Some(p) = cache.get(&(*key, half)) {
            return Ok(p.clone());
        }
        if (half || source.contains("enable f16;")) && !self.shader_f16 {
            return Err(compile_error(format!(
                "kernel {key} needs f16, which {} does not have (shader-f16)",
                self.info.name
            )));
        }
        let source = if half {
            format!(
                "enable f16;\n{}",
                source.replace(STORAGE_F32, "alias T = f16;")
            )
        } else {
            source.to_string()
        };
        let pipeline = self.scoped(&format!("kernel {key}"), || {
            let module = self
                .device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(key),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                });
            Arc::new(
                self.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(key),
                        layout: None,
                        module: &module,
                        entry_point: Some("main"),
                        compilation_options: Default::default(),
                        cache: None,
                    }),
            )
        })?;
        cache.insert((*key, half), pipeline.clone());
        Ok(pipeline)
    }

    /// A storage buffer of `bytes` (rounded up to whole words, at least one).
    pub fn buffer(&self, bytes: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes.next_multiple_of(4).max(4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer holding `data` (zero-padded to whole words).
    pub fn buffer_with(&self, data: &[u8]) -> wgpu::Buffer {
        let mut bytes = data.to_vec();
        bytes.resize(data.len().next_multiple_of(4).max(4), 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: &bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
            })
    }

    /// A buffer the host reads results from (whole words).
    pub fn staging(&self, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes.next_multiple_of(4).max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Waits for the queue's work to finish.
    pub fn wait(&self) -> Result<(), PluginError> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| PluginError::Infer(format!("GPU: {e}")))
    }

    /// Reads `bytes` bytes back from a mapped-readable `staging` buffer.
    pub fn read(&self, staging: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>, PluginError> {
        let slice = staging.slice(0..bytes.next_multiple_of(4).max(4));
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|e| PluginError::Infer(format!("GPU map: {e}")))?
            .map_err(|e| PluginError::Infer(format!("GPU map: {e}")))?;
        let data = slice
            .get_mapped_range()
            .map_err(|e| PluginError::Infer(format!("GPU map: {e:?}")))?[..bytes as usize]
            .to_vec();
        staging.unmap();
        Ok(data)
    }
}
