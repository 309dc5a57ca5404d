"""The per-lane indexing of native/src/backend/cuda/attention_mma.cu, emulated with NumPy.

The kernels cannot run without a GPU; what can go wrong in them without showing at compile
time is mostly which lane holds which element of an mma.sync.m16n8k16 fragment. This script
rebuilds each warp's fragments exactly as the kernels index them (the same expressions, one
lane at a time), multiplies them by the layouts of the PTX ISA ("Matrix Fragments for
mma.m16n8k16 with floating point type"), and compares the forward's output and log-sum-exp
and the backward's dQ, dK and dV with plain causal / bidirectional attention in float64
(bf16 rounding is left out: this checks the indexing, test/native/cuda.test.ts the numerics
on a GPU). Keep it in step with the kernels. Needs only NumPy:

    python3 native/test/attention_mma_emulation.py

It prints the largest differences (about 1e-15 when the indexing is right) and exits 1 if
any is above 1e-9.
"""
import sys

import numpy as np

rng = np.random.default_rng(0)

def mma(d, a, b):
    # d: [32][4], a: [32][4][2], b: [32][2][2] per-lane fragments -> rebuild matrices
    A = np.zeros((16,16)); B = np.zeros((16,8))
    for lane in range(32):
        g, t = lane//4, lane%4
        for f in range(4):
            r = g + 8*(f%2); c = 2*t + 8*(f//2)
            A[r, c], A[r, c+1] = a[lane][f]
        for f in range(2):
            k = 2*t + 8*f
            B[k, g], B[k+1, g] = b[lane][f]
    D = A @ B
    for lane in range(32):
        g, t = lane//4, lane%4
        d[lane][0] += D[g, 2*t]; d[lane][1] += D[g, 2*t+1]
        d[lane][2] += D[g+8, 2*t]; d[lane][3] += D[g+8, 2*t+1]

def forward(HD, T, causal, q0=0):
    BQ = BK = 64; KS = HD//16; NT = BK//8; ND = HD//8
    Q = rng.standard_normal((T, HD)); K = rng.standard_normal((T, HD)); V = rng.standard_normal((T, HD))
    scale_log2 = 1/np.sqrt(HD) * 1.4426950408889634
    out = np.zeros((T, HD)); lse = np.full(T, np.nan)
    for warp in range(4):
        w0 = q0 + warp*16
        row = [[w0 + (l//4) + 8*r for r in range(2)] for l in range(32)]
        qa = [[[ (Q[row[l][f%2], kk*16+2*(l%4)+8*(f//2)], Q[row[l][f%2], kk*16+2*(l%4)+8*(f//2)+1]) if row[l][f%2] < T else (0,0) for f in range(4)] for kk in range(KS)] for l in range(32)]
        o = np.zeros((32, ND, 4)); m = np.full((32,2), -np.inf); lsum = np.zeros((32,2))
        key_end = min(q0+BQ, T) if causal else T
        for k0 in range(0, key_end, BK):
            sK = np.zeros((BK, HD)); sVt = np.zeros((HD, BK))
            for j in range(BK):
                if k0+j < T: sK[j] = K[k0+j]; sVt[:, j] = V[k0+j]
            if causal and k0 > w0 + 15: continue
            s = np.zeros((32, NT, 4))
            for nt in range(NT):
                for kk in range(KS):
                    a = [qa[l][kk] for l in range(32)]
                    b = [[(sK[nt*8+l//4, kk*16+2*(l%4)], sK[nt*8+l//4, kk*16+2*(l%4)+1]),
                          (sK[nt*8+l//4, kk*16+8+2*(l%4)], sK[nt*8+l//4, kk*16+8+2*(l%4)+1])] for l in range(32)]
                    d = [list(s[l][nt]) for l in range(32)]
                    mma(d, a, b)
                    for l in range(32): s[l][nt] = d[l]
            tmax = np.full((32,2), -np.inf)
            for l in range(32):
                t = l % 4
                for nt in range(NT):
                    for e in range(4):
                        r = e//2; jj = nt*8 + 2*t + e%2; j = k0 + jj
                        valid = j < T and row[l][r] < T and (not causal or j <= row[l][r])
                        s[l][nt][e] = s[l][nt][e]*scale_log2 if valid else -np.inf
                        tmax[l][r] = max(tmax[l][r], s[l][nt][e])
            for l in range(32):
                quad = [4*(l//4)+i for i in range(4)]
                for r in range(2):
                    mn = max(m[l][r], max(tmax[q][r] for q in quad))
                    mref = 0.0 if mn == -np.inf else mn
                    alpha = 2.0**(m[l][r]-mref); m[l][r] = mn
                    sm = 0
                    for nt in range(NT):
                        for e in (2*r, 2*r+1):
                            s[l][nt][e] = 2.0**(s[l][nt][e]-mref); sm += s[l][nt][e]
                    lsum[l][r] = lsum[l][r]*alpha + sm
                    o[l][:, 2*r] *= alpha; o[l][:, 2*r+1] *= alpha
            for kk in range(BK//16):
                pa = [[(s[l][2*kk][0], s[l][2*kk][1]), (s[l][2*kk][2], s[l][2*kk][3]),
                       (s[l][2*kk+1][0], s[l][2*kk+1][1]), (s[l][2*kk+1][2], s[l][2*kk+1][3])] for l in range(32)]
                for nd in range(ND):
                    b = [[(sVt[nd*8+l//4, kk*16+2*(l%4)], sVt[nd*8+l//4, kk*16+2*(l%4)+1]),
                          (sVt[nd*8+l//4, kk*16+8+2*(l%4)], sVt[nd*8+l//4, kk*16+8+2*(l%4)+1])] for l in range(32)]
                    d = [list(o[l][nd]) for l in range(32)]
                    mma(d, pa, b)
                    for l in range(32): o[l][nd] = d[l]
        for l in range(32):
            quad = [4*(l//4)+i for i in range(4)]
            for r in range(2):
                total = sum(lsum[q][r] for q in quad); i = row[l][r]
                if i >= T: continue
                if l % 4 == 0: lse[i] = (m[l][r] + np.log2(total)) * np.log(2)
                for nd in range(ND):
                    out[i, nd*8+2*(l%4)] = o[l][nd][2*r]/total
                    out[i, nd*8+2*(l%4)+1] = o[l][nd][2*r+1]/total
    # reference
    S = Q @ K.T / np.sqrt(HD)
    if causal: S = np.where(np.tril(np.ones((T,T)))>0, S, -np.inf)
    ref_lse = np.log(np.exp(S - S.max(1, keepdims=True)).sum(1)) + S.max(1)
    P = np.exp(S - ref_lse[:, None]); ref = P @ V
    n = min(T, 64)  # the block at q0 = 0
    return max(np.abs(out[:n] - ref[:n]).max(), np.abs(lse[:n] - ref_lse[:n]).max())

def backward(HD, T):
    BK = 64; BQ = 32 if HD == 128 else 64; KS = HD//16; NT = BQ//8; QS = BQ//16; ND = HD//8
    LDT = BQ + 8
    Q = rng.standard_normal((T, HD)); K = rng.standard_normal((T, HD)); V = rng.standard_normal((T, HD)); dO = rng.standard_normal((T, HD))
    scale = 1/np.sqrt(HD); log2e = 1.4426950408889634; scale_log2 = scale*log2e
    S = Q @ K.T * scale; S = np.where(np.tril(np.ones((T,T)))>0, S, -np.inf)
    lse = np.log(np.exp(S - S.max(1, keepdims=True)).sum(1)) + S.max(1)
    P = np.exp(S - lse[:,None]); O = P @ V
    delta = (dO*O).sum(1)
    ref_dV = P.T @ dO; dP = dO @ V.T; dS = P*(dP - delta[:,None]); ref_dQ = dS @ K * scale; ref_dK = dS.T @ Q * scale
    dq = np.zeros((T, HD)); dK = np.zeros((T, HD)); dV = np.zeros((T, HD))
    for k0 in range(0, T, BK):
        sK = np.zeros((BK, HD)); sV = np.zeros((BK, HD))
        for j in range(BK):
            if k0+j < T: sK[j] = K[k0+j]; sV[j] = V[k0+j]
        dk = np.zeros((4, 32, ND, 4)); dv = np.zeros((4, 32, ND, 4))
        query_end = T
        for q0 in range(k0//BQ*BQ, query_end, BQ):
            sQ = np.zeros((BQ, HD)); sdO = np.zeros((BQ, HD))
            for i in range(BQ):
                if q0+i < T: sQ[i] = Q[q0+i]; sdO[i] = dO[q0+i]
            sQt = sQ.T; sdOt = sdO.T
            sLse = [lse[q0+r]*log2e if q0+r < T else 0 for r in range(BQ)]
            sDelta = [delta[q0+r] if q0+r < T else 0 for r in range(BQ)]
            sdSt = np.zeros((BK, LDT))
            s_all = {}
            for warp in range(4):
                kw = warp*16
                s = np.zeros((32, NT, 4)); dp = np.zeros((32, NT, 4))
                for nt in range(NT):
                    for kk in range(KS):
                        ka=[];va=[];qb=[];ob=[]
                        for l in range(32):
                            g,t=l//4,l%4; key=[kw+g,kw+g+8]; col=kk*16+2*t
                            ka.append([(sK[key[0],col],sK[key[0],col+1]),(sK[key[1],col],sK[key[1],col+1]),(sK[key[0],col+8],sK[key[0],col+9]),(sK[key[1],col+8],sK[key[1],col+9])])
                            va.append([(sV[key[0],col],sV[key[0],col+1]),(sV[key[1],col],sV[key[1],col+1]),(sV[key[0],col+8],sV[key[0],col+9]),(sV[key[1],col+8],sV[key[1],col+9])])
                            r=nt*8+g
                            qb.append([(sQ[r,col],sQ[r,col+1]),(sQ[r,col+8],sQ[r,col+9])])
                            ob.append([(sdO[r,col],sdO[r,col+1]),(sdO[r,col+8],sdO[r,col+9])])
                        d=[list(s[l][nt]) for l in range(32)]; mma(d,ka,qb)
                        for l in range(32): s[l][nt]=d[l]
                        d=[list(dp[l][nt]) for l in range(32)]; mma(d,va,ob)
                        for l in range(32): dp[l][nt]=d[l]
                for l in range(32):
                    g,t=l//4,l%4; key=[kw+g,kw+g+8]
                    for nt in range(NT):
                        for e in range(4):
                            jj=key[e//2]; ii=nt*8+2*t+e%2
                            valid = k0+jj < T and q0+ii < T and k0+jj <= q0+ii
                            p = 2.0**(s[l][nt][e]*scale_log2 - sLse[ii]) if valid else 0.0
                            s[l][nt][e]=p; dp[l][nt][e]=p*(dp[l][nt][e]-sDelta[ii])*scale
                        for r in range(2):
                            sdSt[key[r], nt*8+2*t] = dp[l][nt][2*r]; sdSt[key[r], nt*8+2*t+1] = dp[l][nt][2*r+1]
                for qq in range(QS):
                    pa=[[(s[l][2*qq][0],s[l][2*qq][1]),(s[l][2*qq][2],s[l][2*qq][3]),(s[l][2*qq+1][0],s[l][2*qq+1][1]),(s[l][2*qq+1][2],s[l][2*qq+1][3])] for l in range(32)]
                    da=[[(dp[l][2*qq][0],dp[l][2*qq][1]),(dp[l][2*qq][2],dp[l][2*qq][3]),(dp[l][2*qq+1][0],dp[l][2*qq+1][1]),(dp[l][2*qq+1][2],dp[l][2*qq+1][3])] for l in range(32)]
                    for nd in range(ND):
                        ob=[];qb=[]
                        for l in range(32):
                            g,t=l//4,l%4; c=qq*16+2*t
                            ob.append([(sdOt[nd*8+g,c],sdOt[nd*8+g,c+1]),(sdOt[nd*8+g,c+8],sdOt[nd*8+g,c+9])])
                            qb.append([(sQt[nd*8+g,c],sQt[nd*8+g,c+1]),(sQt[nd*8+g,c+8],sQt[nd*8+g,c+9])])
                        d=[list(dv[warp][l][nd]) for l in range(32)]; mma(d,pa,ob)
                        for l in range(32): dv[warp][l][nd]=d[l]
                        d=[list(dk[warp][l][nd]) for l in range(32)]; mma(d,da,qb)
                        for l in range(32): dk[warp][l][nd]=d[l]
            # dQ
            for warp in range(4):
                for f in range(warp, QS*ND, 4):
                    mt, nd = f//ND, f%ND
                    acc=[[0.0]*4 for _ in range(32)]
                    for kk in range(BK//16):
                        a=[];kb=[]
                        for l in range(32):
                            g,t=l//4,l%4
                            r0=kk*16+2*t; c0=mt*16+g
                            pair=lambda M,r,c: (M[r,c], M[r+1,c])
                            a.append([pair(sdSt,r0,c0),pair(sdSt,r0,c0+8),pair(sdSt,r0+8,c0),pair(sdSt,r0+8,c0+8)])
                            kb.append([pair(sK,r0,nd*8+g),pair(sK,r0+8,nd*8+g)])
                        mma(acc,a,kb)
                    for l in range(32):
                        g,t=l//4,l%4
                        for e in range(4):
                            i=q0+mt*16+g+8*(e//2)
                            if i < T: dq[i, nd*8+2*t+e%2] += acc[l][e]
        for warp in range(4):
            for l in range(32):
                g,t=l//4,l%4
                for r in range(2):
                    j=k0+warp*16+g+8*r
                    if j>=T: continue
                    for nd in range(ND):
                        dK[j, nd*8+2*t]=dk[warp][l][nd][2*r]; dK[j, nd*8+2*t+1]=dk[warp][l][nd][2*r+1]
                        dV[j, nd*8+2*t]=dv[warp][l][nd][2*r]; dV[j, nd*8+2*t+1]=dv[warp][l][nd][2*r+1]
    return max(float(np.abs(a - b).max()) for a, b in ((dq, ref_dQ), (dK, ref_dK), (dV, ref_dV)))

if __name__ == "__main__":
    worst = 0.0
    for HD in (16, 64, 128):
        for T, causal in ((37, True), (64, False), (130, True)):
            err = forward(HD, T, causal)
            print(f"forward  head_dim {HD:3d}, T {T:3d}, causal {causal}: {err:.1e}")
            worst = max(worst, err)
    for HD, T in ((16, 100), (64, 130), (128, 70)):
        err = backward(HD, T)
        print(f"backward head_dim {HD:3d}, T {T:3d}: {err:.1e}")
        worst = max(worst, err)
    sys.exit(0 if worst < 1e-9 else 1)
