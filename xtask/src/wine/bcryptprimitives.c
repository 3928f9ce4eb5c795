/* A stand-in for Windows' bcryptprimitives.dll, for Wine before 9 only (Debian 12 ships
 * Wine 8). Rust's standard library takes its random numbers from ProcessPrng there since
 * Rust 1.78; Windows 10 and later have it, Wine 8 does not, so every Rust program fails to
 * start. `cargo xtask` builds this with mingw-w64 into the Wine prefix's system32, never
 * into a release: ProcessPrng here is RtlGenRandom (advapi32's SystemFunction036). */
#include <windows.h>
#define SystemFunction036 NTAPI SystemFunction036
#include <ntsecapi.h>
#undef SystemFunction036

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!RtlGenRandom(data, n))
            return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
