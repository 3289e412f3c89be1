/* The GSSAPI calls of a statically linked libzmq, each failing: linked into kvproof's programs
 * in place of MIT Kerberos's libgssapi_krb5, which Debian ships only as a shared library.
 *
 * libzmq.a's GSSAPI security mechanism references these names, so a static libzmq does not
 * link without them; kvproof's sockets never select that mechanism (they set none of
 * ZMQ_GSSAPI_SERVER, ZMQ_GSSAPI_PRINCIPAL, ZMQ_GSSAPI_SERVICE_PRINCIPAL), so none of them is
 * called. Were one called, a peer asking for GSSAPI would see its handshake fail
 * (GSS_S_UNAVAILABLE), never a crash. Only in programs built with KVPROOF_PORTABLE_BINARIES
 * (CMakeLists.txt), which link libzmq.a instead of libzmq.so. */
#include <gssapi/gssapi.h>
#include <stddef.h>

gss_OID GSS_C_NT_USER_NAME = NULL;
gss_OID GSS_C_NT_HOSTBASED_SERVICE = NULL;

static OM_uint32 unavailable(OM_uint32* minor_status) {
  if (minor_status != NULL) *minor_status = 0;
  return GSS_S_UNAVAILABLE;
}

OM_uint32 gss_acquire_cred(OM_uint32* minor, gss_name_t name, OM_uint32 time_req, gss_OID_set mechs,
                           gss_cred_usage_t usage, gss_cred_id_t* cred, gss_OID_set* actual, OM_uint32* time_rec) {
  (void)name, (void)time_req, (void)mechs, (void)usage, (void)cred, (void)actual, (void)time_rec;
  return unavailable(minor);
}

OM_uint32 gss_release_cred(OM_uint32* minor, gss_cred_id_t* cred) {
  (void)cred;
  return unavailable(minor);
}

OM_uint32 gss_init_sec_context(OM_uint32* minor, gss_cred_id_t cred, gss_ctx_id_t* ctx, gss_name_t target, gss_OID mech,
                               OM_uint32 req_flags, OM_uint32 time_req, gss_channel_bindings_t bindings,
                               gss_buffer_t input, gss_OID* actual_mech, gss_buffer_t output, OM_uint32* ret_flags,
                               OM_uint32* time_rec) {
  (void)cred, (void)ctx, (void)target, (void)mech, (void)req_flags, (void)time_req, (void)bindings;
  (void)input, (void)actual_mech, (void)output, (void)ret_flags, (void)time_rec;
  return unavailable(minor);
}

OM_uint32 gss_accept_sec_context(OM_uint32* minor, gss_ctx_id_t* ctx, gss_cred_id_t cred, gss_buffer_t input,
                                 gss_channel_bindings_t bindings, gss_name_t* src_name, gss_OID* mech,
                                 gss_buffer_t output, OM_uint32* ret_flags, OM_uint32* time_rec,
                                 gss_cred_id_t* delegated) {
  (void)ctx, (void)cred, (void)input, (void)bindings, (void)src_name, (void)mech, (void)output;
  (void)ret_flags, (void)time_rec, (void)delegated;
  return unavailable(minor);
}

OM_uint32 gss_delete_sec_context(OM_uint32* minor, gss_ctx_id_t* ctx, gss_buffer_t output) {
  (void)ctx, (void)output;
  return unavailable(minor);
}

OM_uint32 gss_wrap(OM_uint32* minor, gss_ctx_id_t ctx, int conf_req, gss_qop_t qop, gss_buffer_t input, int* conf_state,
                   gss_buffer_t output) {
  (void)ctx, (void)conf_req, (void)qop, (void)input, (void)conf_state, (void)output;
  return unavailable(minor);
}

OM_uint32 gss_unwrap(OM_uint32* minor, gss_ctx_id_t ctx, gss_buffer_t input, gss_buffer_t output, int* conf_state,
                     gss_qop_t* qop) {
  (void)ctx, (void)input, (void)output, (void)conf_state, (void)qop;
  return unavailable(minor);
}

OM_uint32 gss_display_name(OM_uint32* minor, gss_name_t name, gss_buffer_t output, gss_OID* type) {
  (void)name, (void)output, (void)type;
  return unavailable(minor);
}

OM_uint32 gss_import_name(OM_uint32* minor, gss_buffer_t input, gss_OID type, gss_name_t* output) {
  (void)input, (void)type, (void)output;
  return unavailable(minor);
}

OM_uint32 gss_release_name(OM_uint32* minor, gss_name_t* name) {
  (void)name;
  return unavailable(minor);
}

OM_uint32 gss_release_buffer(OM_uint32* minor, gss_buffer_t buffer) {
  (void)buffer;
  return unavailable(minor);
}
