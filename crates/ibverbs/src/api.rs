//! Every exported C function, by its C name: `build.rs` aliases `crate::api::<name>` to
//! the versioned symbol listed in `exports.txt` (a missing one fails the build).
#![allow(unused_imports)]

pub(crate) use crate::cq::{
    ibv_ack_cq_events, ibv_create_cq, ibv_destroy_cq, ibv_get_cq_event, ibv_resize_cq,
};
pub(crate) use crate::device::{
    _ibv_query_gid_ex, _ibv_query_gid_table, ibv_close_device, ibv_free_device_list,
    ibv_get_device_guid, ibv_get_device_index, ibv_get_device_list, ibv_get_device_name,
    ibv_get_pkey_index, ibv_open_device, ibv_query_device, ibv_query_gid, ibv_query_gid_type,
    ibv_query_pkey, ibv_query_port, ibv_read_sysfs_file, ibv_resolve_eth_l2_from_gid,
};
pub(crate) use crate::event::{ibv_ack_async_event, ibv_get_async_event};
pub(crate) use crate::misc::*;
pub(crate) use crate::objects::{
    ibv_alloc_pd, ibv_create_ah, ibv_create_ah_from_wc, ibv_create_comp_channel, ibv_dealloc_pd,
    ibv_dereg_mr, ibv_destroy_ah, ibv_destroy_comp_channel, ibv_init_ah_from_wc, ibv_reg_mr,
    ibv_reg_mr_iova, ibv_reg_mr_iova2,
};
pub(crate) use crate::qp::{
    ibv_attach_mcast, ibv_create_qp, ibv_create_srq, ibv_destroy_qp, ibv_destroy_srq,
    ibv_detach_mcast, ibv_modify_qp, ibv_modify_srq, ibv_qp_to_qp_ex, ibv_query_qp,
    ibv_query_qp_data_in_order, ibv_query_srq, softhca_create_gsi_qp,
};
pub(crate) use crate::unsupported::*;
