package native

/*
#include "openshell.h"
*/
import "C"

import (
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Fault orders of LocalCluster.Fault.
const (
	FaultStopReplica  = uint32(C.OS_FAULT_STOP_REPLICA)
	FaultKillReplica  = uint32(C.OS_FAULT_KILL_REPLICA)
	FaultStartReplica = uint32(C.OS_FAULT_START_REPLICA)
	FaultCutRoute     = uint32(C.OS_FAULT_CUT_ROUTE)
	FaultRestoreRoute = uint32(C.OS_FAULT_RESTORE_ROUTE)
	FaultRestartEdge  = uint32(C.OS_FAULT_RESTART_EDGE)
	FaultKillHost     = uint32(C.OS_FAULT_KILL_HOST)
	FaultStartHost    = uint32(C.OS_FAULT_START_HOST)
	FaultCutStore     = uint32(C.OS_FAULT_CUT_STORE)
	FaultRestoreStore = uint32(C.OS_FAULT_RESTORE_STORE)
)

// Texts of openshell_local_cluster_text.
const (
	clusterEndpoint   = C.int32_t(C.OS_CLUSTER_ENDPOINT)
	clusterDataDir    = C.int32_t(C.OS_CLUSTER_DATA_DIR)
	clusterReplicaIDs = C.int32_t(C.OS_CLUSTER_REPLICA_IDS)
	clusterHostIDs    = C.int32_t(C.OS_CLUSTER_HOST_IDS)
)

// ClusterOptions are the options of a local cluster; empty strings are
// the library's defaults.
type ClusterOptions struct {
	Replicas, Hosts uint32
	ConfigDelivery  string
	Isolation       string
	RestartCrashed  bool
	GatewayBin      string
}

// LocalCluster is an OsLocalCluster.
type LocalCluster struct {
	mu sync.RWMutex
	p  *C.OsLocalCluster
}

// StartLocalCluster starts a cluster and waits until it serves (or fails).
func StartLocalCluster(o ClusterOptions) (*LocalCluster, *Error) {
	var opts C.OsLocalClusterOptions
	opts.replicas = C.uint32_t(o.Replicas)
	opts.hosts = C.uint32_t(o.Hosts)
	opts.config_delivery = stringOf(o.ConfigDelivery)
	opts.isolation = stringOf(o.Isolation)
	opts.restart_crashed = C.bool(o.RestartCrashed)
	opts.gateway_bin = stringOf(o.GatewayBin)
	comp := await(func(cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_local_cluster_start(opts, cb, ud)
	})
	if comp.Status == StatusError {
		return nil, comp.Err
	}
	return &LocalCluster{p: (*C.OsLocalCluster)(comp.Handle)}, nil
}

func (c *LocalCluster) text(which C.int32_t) string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.p == nil {
		return ""
	}
	out := C.openshell_local_cluster_text(c.p, which)
	s := ""
	if out.len > 0 {
		s = C.GoStringN((*C.char)(unsafe.Pointer(out.ptr)), C.int(out.len))
	}
	C.openshell_bytes_free(out)
	return s
}

func ids(s string) []string {
	if s == "" {
		return []string{}
	}
	return strings.Split(strings.TrimSuffix(s, "\x00"), "\x00")
}

// Endpoint is the edge's URL.
func (c *LocalCluster) Endpoint() string { return c.text(clusterEndpoint) }

// DataDir is the cluster's data directory.
func (c *LocalCluster) DataDir() string { return c.text(clusterDataDir) }

// ReplicaIDs are the replica ids in order.
func (c *LocalCluster) ReplicaIDs() []string { return ids(c.text(clusterReplicaIDs)) }

// HostIDs are the shared host ids in order.
func (c *LocalCluster) HostIDs() []string { return ids(c.text(clusterHostIDs)) }

// start runs an async export with the handle held (Free waits for the
// export itself, not for its completion: the call keeps the cluster alive).
func (c *LocalCluster) start(f func(p *C.OsLocalCluster, cb C.OsCallback, ud C.size_t) C.int32_t) Completion {
	c.mu.RLock()
	p := c.p
	if p == nil {
		c.mu.RUnlock()
		return Completion{Status: StatusError, Err: &Error{Code: "cluster", Message: "the cluster is stopped", GRPCStatus: 14}}
	}
	return await(func(cb C.OsCallback, ud C.size_t) C.int32_t {
		defer c.mu.RUnlock()
		return f(p, cb, ud)
	})
}

// Fault orders one fault (Fault*) on replica or host id.
func (c *LocalCluster) Fault(fault uint32, id string) *Error {
	return c.start(func(p *C.OsLocalCluster, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_local_cluster_fault(p, C.uint32_t(fault), stringOf(id), cb, ud)
	}).Err
}

// SlowStore delays every store call of the replicas by delay.
func (c *LocalCluster) SlowStore(delay time.Duration) *Error {
	return c.start(func(p *C.OsLocalCluster, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_local_cluster_slow_store(p, C.uint64_t(delay.Milliseconds()), cb, ud)
	}).Err
}

// OwnerOf is the replica holding sandbox's session ("" when none).
func (c *LocalCluster) OwnerOf(sandbox string) (string, *Error) {
	comp := c.start(func(p *C.OsLocalCluster, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_local_cluster_owner_of(p, stringOf(sandbox), cb, ud)
	})
	return string(comp.Value), comp.Err
}

// Close stops the cluster (idempotent; nil once freed).
func (c *LocalCluster) Close() *Error {
	c.mu.RLock()
	freed := c.p == nil
	c.mu.RUnlock()
	if freed {
		return nil
	}
	return c.start(func(p *C.OsLocalCluster, cb C.OsCallback, ud C.size_t) C.int32_t {
		return C.openshell_local_cluster_close(p, cb, ud)
	}).Err
}

// Free releases the handle; a cluster not closed is stopped by the
// library (on this thread, or on the one ending the last call using it).
func (c *LocalCluster) Free() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p != nil {
		C.openshell_local_cluster_free(c.p)
		c.p = nil
	}
}
