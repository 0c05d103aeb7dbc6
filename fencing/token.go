package fencing

// Token is a fencing token: the fence of a lease grant, and the lease's name.
// ...
type Token struct {
	Lease string
	Fence int64
}
