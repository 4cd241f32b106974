// Block gather/scatter between paged KV and a contiguous chunk; one thread block per (page, layer-plane).
//
//   paged:  [layer_planes][num_blocks][page_bytes]   (byte strides passed in; pages contiguous)
//   chunk:  [layer_planes][num_pages ][page_bytes]   (contiguous)
//
// grid = (num_pages, layer_planes); each thread copies 16-byte uint4 vectors (the *_v16 kernels,
// used when page_bytes and every base address are 16-byte aligned) or single bytes otherwise.

extern "C" __global__ void gather_blocks_v16(const char* __restrict__ paged, char* __restrict__ chunk,
                                             const long long* __restrict__ block_ids, long long page_bytes,
                                             long long paged_plane_stride, long long paged_block_stride,
                                             long long chunk_plane_stride) {
    const long long page = blockIdx.x;
    const long long plane = blockIdx.y;
    const uint4* src = reinterpret_cast<const uint4*>(paged + plane * paged_plane_stride + block_ids[page] * paged_block_stride);
    uint4* dst = reinterpret_cast<uint4*>(chunk + plane * chunk_plane_stride + page * page_bytes);
    const long long num_vectors = page_bytes / 16;
    for (long long i = threadIdx.x; i < num_vectors; i += blockDim.x) {
        dst[i] = src[i];
    }
}

extern "C" __global__ void scatter_blocks_v16(const char* __restrict__ chunk, char* __restrict__ paged,
                                              const long long* __restrict__ block_ids, long long page_bytes,
                                              long long paged_plane_stride, long long paged_block_stride,
                                              long long chunk_plane_stride) {
    const long long page = blockIdx.x;
    const long long plane = blockIdx.y;
    const uint4* src = reinterpret_cast<const uint4*>(chunk + plane * chunk_plane_stride + page * page_bytes);
    uint4* dst = reinterpret_cast<uint4*>(paged + plane * paged_plane_stride + block_ids[page] * paged_block_stride);
    const long long num_vectors = page_bytes / 16;
    for (long long i = threadIdx.x; i < num_vectors; i += blockDim.x) {
        dst[i] = src[i];
    }
}

extern "C" __global__ void gather_blocks_b1(const char* __restrict__ paged, char* __restrict__ chunk,
                                            const long long* __restrict__ block_ids, long long page_bytes,
                                            long long paged_plane_stride, long long paged_block_stride,
                                            long long chunk_plane_stride) {
    const long long page = blockIdx.x;
    const long long plane = blockIdx.y;
    const char* src = paged + plane * paged_plane_stride + block_ids[page] * paged_block_stride;
    char* dst = chunk + plane * chunk_plane_stride + page * page_bytes;
    for (long long i = threadIdx.x; i < page_bytes; i += blockDim.x) {
        dst[i] = src[i];
    }
}

extern "C" __global__ void scatter_blocks_b1(const char* __restrict__ chunk, char* __restrict__ paged,
                                             const long long* __restrict__ block_ids, long long page_bytes,
                                             long long paged_plane_stride, long long paged_block_stride,
                                             long long chunk_plane_stride) {
    const long long page = blockIdx.x;
    const long long plane = blockIdx.y;
    const char* src = chunk + plane * chunk_plane_stride + page * page_bytes;
    char* dst = paged + plane * paged_plane_stride + block_ids[page] * paged_block_stride;
    for (long long i = threadIdx.x; i < page_bytes; i += blockDim.x) {
        dst[i] = src[i];
    }
}
