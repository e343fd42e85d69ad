//! What rdma-core sees: the verbs devices on this host and their transports.

use std::ffi::CStr;

pub(crate) mod backend;
pub(crate) mod cm;
pub(crate) mod rc;

use crate::transport::Transport;

/// `IBV_LINK_LAYER_ETHERNET` from `<infiniband/verbs.h>` (an anonymous enum bindgen skips).
const LINK_LAYER_ETHERNET: u8 = 2;

/// One RDMA device as rdma-core reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device name (`mlx5_0`, `siw0`, `rxe0`, ...).
    pub name: String,
    /// Its transport, from the node type and port 1's link layer.
    pub transport: Transport,
}

/// Lists the verbs devices (`ibv_get_device_list(3)`). Empty where there is no RDMA device or
/// no RDMA subsystem at all.
///
/// ```
/// for d in barewire_drivers::verbs_devices() {
///     println!("{}: {:?}", d.name, d.transport); // e.g. "mlx5_0: RoCEv2", "siw0: IWarp"
/// }
/// ```
pub fn verbs_devices() -> Vec<DeviceInfo> {
    let mut n = 0i32;
    // SAFETY: rdma-core allocates the list; we free it below and copy what we keep.
    let list = unsafe { rdma_sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds n valid device pointers.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: ibv_get_device_name returns a NUL-terminated string owned by the device.
        let name = unsafe { CStr::from_ptr(rdma_sys::ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        out.push(DeviceInfo {
            transport: transport_of(dev),
            name,
        });
    }
    // SAFETY: freeing the list rdma-core gave us; the devices stay valid for rdma-core.
    unsafe { rdma_sys::ibv_free_device_list(list) };
    out
}

fn transport_of(dev: *mut rdma_sys::ibv_device) -> Transport {
    // SAFETY: dev is a valid device from ibv_get_device_list.
    let t = unsafe { (*dev).transport_type };
    if t == rdma_sys::ibv_transport_type::IBV_TRANSPORT_IWARP {
        return Transport::IWarp;
    }
    // InfiniBand or RoCE: port 1's link layer tells (Ethernet means RoCE; v2 is the norm today).
    // SAFETY: opening and closing a device context; failure leaves us with the IB default.
    unsafe {
        let ctx = rdma_sys::ibv_open_device(dev);
        if ctx.is_null() {
            return Transport::InfiniBand;
        }
        let mut attr: rdma_sys::ibv_port_attr = std::mem::zeroed();
        let rc = rdma_sys::___ibv_query_port(ctx, 1, &mut attr);
        rdma_sys::ibv_close_device(ctx);
        if rc == 0 && attr.link_layer == LINK_LAYER_ETHERNET {
            Transport::RoCEv2
        } else {
            Transport::InfiniBand
        }
    }
}
