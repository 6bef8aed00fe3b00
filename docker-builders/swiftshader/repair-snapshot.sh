#!/bin/sh
# Make an incomplete source snapshot buildable; a no-op on a complete checkout.
# Snapshots without Git's large blobs lack LLVM 16's generated X86 TableGen tables and
# Vulkan-Headers' vulkan_structs.hpp. Each repair runs only when its file is missing.
set -eu

src=$1
x86="$src/third_party/llvm-16.0/configs/common/lib/Target/X86"
llvm="$src/third_party/llvm-16.0/llvm"

missing_tables=0
for f in AsmMatcher AsmWriter AsmWriter1 CallingConv DAGISel DisassemblerTables EVEX2VEXTables \
         Exegesis FastISel GlobalISel InstrInfo MnemonicTables RegisterBank RegisterInfo SubtargetInfo; do
    [ -s "$x86/X86Gen$f.inc" ] || missing_tables=1
done

if [ "$missing_tables" = 1 ]; then
    echo "repair-snapshot.sh: regenerating LLVM 16 X86 tables with Debian's llvm-tblgen-16"
    apt-get update -q
    apt-get install -y -q --no-install-recommends llvm-16
    tblgen=/usr/lib/llvm-16/bin/llvm-tblgen
    # All 15 from one tblgen so that the tables agree with each other (the flags are those of
    # llvm/lib/Target/X86/CMakeLists.txt).
    while read -r out flags; do
        # shellcheck disable=SC2086  # flags are several words on purpose
        "$tblgen" $flags -I "$llvm/include" -I "$llvm/lib/Target/X86" \
            "$llvm/lib/Target/X86/X86.td" -o "$x86/$out"
    done <<TABLES
X86GenAsmMatcher.inc -gen-asm-matcher
X86GenAsmWriter.inc -gen-asm-writer
X86GenAsmWriter1.inc -gen-asm-writer -asmwriternum=1
X86GenCallingConv.inc -gen-callingconv
X86GenDAGISel.inc -gen-dag-isel
X86GenDisassemblerTables.inc -gen-disassembler
X86GenEVEX2VEXTables.inc -gen-x86-EVEX2VEX-tables
X86GenExegesis.inc -gen-exegesis
X86GenFastISel.inc -gen-fast-isel
X86GenGlobalISel.inc -gen-global-isel
X86GenInstrInfo.inc -gen-instr-info -instr-info-expand-mi-operand-info=0
X86GenMnemonicTables.inc -gen-x86-mnemonic-tables -asmwriternum=1
X86GenRegisterBank.inc -gen-register-bank
X86GenRegisterInfo.inc -gen-register-info
X86GenSubtargetInfo.inc -gen-subtarget
TABLES
fi

if [ ! -s "$src/include/vulkan/vulkan_structs.hpp" ]; then
    # vulkan.hpp (which includes vulkan_structs.hpp) is used only by Debug-build pretty printing.
    echo "repair-snapshot.sh: vulkan_structs.hpp missing; guarding the vulkan.hpp include for Release"
    sed -i 's|^#include <vulkan/vulkan.hpp>$|#ifndef NDEBUG\n#include <vulkan/vulkan.hpp>\n#endif|' \
        "$src/src/Vulkan/VkStringify.cpp"
    grep -q '^#ifndef NDEBUG$' "$src/src/Vulkan/VkStringify.cpp"
fi
