<%doc>
Hold a stream busy for a given time: one thread reads the global nanosecond
timer until ns have passed (cc2ops.cuda.runtime.profile uses it to keep the device
busy while the host queues the work it times, so that CUDA events measure
device time without the host's launch gaps).

Constants: name. Argument: ns, the time to wait in nanoseconds. The timer
ticks at about 1 us on current GPUs; __nanosleep keeps the spinning warp
from occupying its scheduler.
</%doc>
<%include file="common.cuh"/>
__device__ __forceinline__ u64 cc2_globaltimer()
{
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void ${name}(u64 ns)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const u64 t0 = cc2_globaltimer();
    while (cc2_globaltimer() - t0 < ns) __nanosleep(2000);
}
